"""Metrics every stage shares, in the process-wide registry the stages process serves on one port:
records consumed and handling time per stage (aiokafka stages and faust apps alike), and the Kafka
consumer lag of every consumer group the catalogue names.

Names follow prometheus_client's conventions: counters end in ``_total``, units in the name.
"""
from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

from aiokafka import TopicPartition
from prometheus_client import Counter, Gauge, Histogram

from topics.catalogue import GATEWAY, GENERATION, STAGES, Topics

log = logging.getLogger(__name__)
# A stage's handling is a few ms (one Redis script, two Cassandra round trips); the tail is what matters.
HANDLE_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 10)

STAGE_RECORDS = Counter("parley_stage_records", "records a stage consumed, by outcome (handled, deadlettered)",
                        ["stage", "outcome"])
STAGE_HANDLE_SECONDS = Histogram("parley_stage_handle_seconds", "time a stage spent handling one record",
                                 ["stage"], buckets=HANDLE_BUCKETS)
STAGE_UP = Gauge("parley_stage_up", "1 while the stage runs in this process", ["stage"])
CONSUMER_LAG = Gauge("parley_kafka_consumer_lag_records",
                     "records on the topic not yet committed by the consumer group (end offset - committed)",
                     ["group", "topic"])


def catalogue_groups(prefix: str = "", pools: Iterable[str] = ()) -> list[str]:
    """Every consumer group a deployment can have: one per stage (the gateway reads without one), one per
    pool for the generation stage."""
    topics = Topics(prefix, pools)
    stages = [topics.group(s) for s in STAGES if s not in (GATEWAY, GENERATION)]
    return stages + [topics.group(GENERATION, pool) for pool in topics.pools]


def lag_by_topic(committed: dict[TopicPartition, int], end: dict[TopicPartition, int],
                 start: dict[TopicPartition, int] | None = None) -> dict[str, int]:
    """Sum of (end - committed) per topic; a partition the group never committed counts from its start."""
    lag: dict[str, int] = {}
    for tp, last in end.items():
        done = committed.get(tp, (start or {}).get(tp, 0))
        lag[tp.topic] = lag.get(tp.topic, 0) + max(0, last - max(done, 0))
    return lag


async def measure_lag(admin: Any, consumer: Any, groups: Iterable[str]) -> dict[tuple[str, str], int]:
    """(group, topic) -> lag for each group with committed offsets, over the topics it committed on (a group
    that never ran has nothing to say yet); sets :data:`CONSUMER_LAG`. ``consumer``: a started, group-less one."""
    from topics.clients import topic_partitions

    found: dict[tuple[str, str], int] = {}
    for group in groups:
        offsets = await admin.list_consumer_group_offsets(group)
        committed = {tp: meta.offset for tp, meta in offsets.items() if meta is not None and meta.offset >= 0}
        if not committed:
            continue
        names = sorted({tp.topic for tp in committed})
        parts = [TopicPartition(t, p) for t in names for p in await topic_partitions(consumer, t)]
        end = await consumer.end_offsets(parts)
        start = await consumer.beginning_offsets(parts)
        for topic, lag in lag_by_topic(committed, end, start).items():
            CONSUMER_LAG.labels(group=group, topic=topic).set(lag)
            found[(group, topic)] = lag
    return found
