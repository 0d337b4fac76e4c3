"""The worker names each token record's partition: the one Kafka's default partitioner would give its key, so
readers that find a generation's partition from its id (the gateways) still find it."""
from __future__ import annotations

from types import SimpleNamespace

from aiokafka.partitioner import DefaultPartitioner

from consumers.generation.appending import Appender


def appender_with(partitions: set[int] | None) -> Appender:
    appender = Appender.__new__(Appender)  # no producer of its own: only its metadata is read
    cluster = SimpleNamespace(partitions_for_topic=lambda topic: partitions)
    appender.producer = SimpleNamespace(client=SimpleNamespace(cluster=cluster))
    return appender


def test_the_named_partition_is_the_default_partitioners() -> None:
    appender = appender_with(set(range(12)))
    for n in range(200):
        key = f"01a2447a-a3c0-7a2d-83de-{n:012d}"
        assert appender.partition("chat.tokens", key) == DefaultPartitioner()(key.encode(), list(range(12)),
                                                                             list(range(12)))


def test_no_partition_is_named_before_the_topic_is_known() -> None:
    assert appender_with(None).partition("chat.tokens", "g") is None
    assert appender_with(set()).partition("chat.tokens", "g") is None
