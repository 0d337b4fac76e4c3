"""Kafka records a run wrote to a topic: the sum of its partitions' end offsets, read before and after."""
from __future__ import annotations

from aiokafka import TopicPartition

from topics.clients import make_consumer, topic_partitions


async def end_offsets(bootstrap: str, topic: str) -> int:
    """The sum of ``topic``'s partitions' end offsets (records ever written, as retention leaves the count)."""
    consumer = make_consumer(bootstrap, group_id=None)
    await consumer.start()
    try:
        tps = [TopicPartition(topic, p) for p in sorted(await topic_partitions(consumer, topic))]
        return sum((await consumer.end_offsets(tps)).values())
    finally:
        await consumer.stop()


async def prefixed_end_offsets(bootstrap: str, prefix: str) -> dict[str, int]:
    """Every topic under ``prefix`` (a private service's), with the sum of its partitions' end offsets."""
    consumer = make_consumer(bootstrap, group_id=None)
    await consumer.start()
    try:
        names = sorted(n for n in await consumer.topics() if n.startswith(prefix))
        tps = [TopicPartition(n, p) for n in names for p in sorted(await topic_partitions(consumer, n))]
        totals = dict.fromkeys(names, 0)
        for tp, end in (await consumer.end_offsets(tps)).items():
            totals[tp.topic] += end
        return totals
    finally:
        await consumer.stop()
