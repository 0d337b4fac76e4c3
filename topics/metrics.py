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


async def measure_lag(admin: Any, consumer: Any, groups: Iterable[str],
                      coordinators: dict[str, int] | None = None) -> dict[tuple[str, str], int]:
    """(group, topic) -> lag for each group with committed offsets, over the topics it committed on (a group
    that never ran has nothing to say yet); sets :data:`CONSUMER_LAG`. ``consumer``: a started, group-less one.

    One offset fetch per group, then the ends and starts of every partition any group committed on in one
    request each, not one pair per group. ``coordinators`` (group -> broker), kept by the caller between polls,
    spares a lookup per group per poll; a group whose fetch fails is looked up again next time."""
    from topics.clients import topic_partitions

    known = {} if coordinators is None else coordinators
    committed: dict[str, dict[TopicPartition, int]] = {}
    for group in groups:
        if group not in known:
            known[group] = await admin.find_coordinator(group)
        try:
            offsets = await admin.list_consumer_group_offsets(group, known[group])
        except Exception:
            known.pop(group, None)  # moved, or gone: found again on the next poll
            raise
        mine = {tp: meta.offset for tp, meta in offsets.items() if meta is not None and meta.offset >= 0}
        if mine:
            committed[group] = mine
    names = sorted({tp.topic for mine in committed.values() for tp in mine})
    parts = [TopicPartition(t, p) for t in names for p in await topic_partitions(consumer, t)]
    if not parts:
        return {}
    end, start = await consumer.end_offsets(parts), await consumer.beginning_offsets(parts)
    found: dict[tuple[str, str], int] = {}
    for group, mine in committed.items():
        topics = {tp.topic for tp in mine}
        ends = {tp: at for tp, at in end.items() if tp.topic in topics}
        for topic, lag in lag_by_topic(mine, ends, start).items():
            CONSUMER_LAG.labels(group=group, topic=topic).set(lag)
            found[(group, topic)] = lag
    return found
