"""The transport every stage shares: typed produce, decode-or-dead-letter, clients tuned for latency.

A record that cannot be decoded is never fatal and never silently dropped: it is
wrapped whole in ``EventDeadLettered`` on the dead-letter topic and its offset
moves on.
"""
from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRecord, TopicPartition

from schemas import ALL_EVENTS, Event, EventDeadLettered, EventDecodeError, decode_record, encode
from topics import Topics

log = logging.getLogger(__name__)


async def topic_partitions(consumer: AIOKafkaConsumer, topic: str, timeout_s: float = 30.0) -> set[int]:
    """The partition numbers of ``topic``, asking the broker when this consumer's metadata lacks it
    (an unassigned consumer knows nothing of a topic until it asks). Raises when the topic never shows."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not (parts := consumer.partitions_for_topic(topic)):
        if asyncio.get_running_loop().time() > deadline:
            raise RuntimeError(f"topic {topic} has no partitions after {timeout_s:.0f}s; run `parley topics`")
        consumer._client.add_topic(topic)  # noqa: SLF001 - aiokafka has no public per-topic metadata call
        await consumer._client.force_metadata_update()  # noqa: SLF001
        if not consumer.partitions_for_topic(topic):
            await asyncio.sleep(0.1)
    return set(parts)


def make_producer(bootstrap: str, **overrides: Any) -> AIOKafkaProducer:
    options: dict[str, Any] = dict(
        bootstrap_servers=bootstrap,
        acks="all",
        enable_idempotence=True,
        linger_ms=0,  # tokens are latency-bound; batching happens per engine step upstream
        compression_type=None,
    )
    options.update(overrides)
    return AIOKafkaProducer(**options)


# A consumer whose partitions are never paused (every stage's but the workers' intake, which pauses and resumes
# its lanes) waits this long on an idle fetch: a record for any partition in the fetch still answers it at once,
# and the broker is asked 0.2 times a second instead of twice. A fetch sent while some partitions are paused
# leaves them out, and a record for them once resumed waits for that fetch's answer: there, the wait is a latency.
STEADY_FETCH_WAIT_MS = 5_000


def make_consumer(bootstrap: str, *topic_names: str, group_id: str | None, **overrides: Any) -> AIOKafkaConsumer:
    options: dict[str, Any] = dict(
        bootstrap_servers=bootstrap,
        group_id=group_id,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        # The broker answers a fetch as soon as one byte arrives (fetch_min_bytes=1), so a long wait costs
        # no latency; a short one only makes every idle consumer poll the broker 100 times a second,
        # which on a small machine takes CPU from the engine.
        fetch_max_wait_ms=500,
        fetch_min_bytes=1,
        isolation_level="read_uncommitted",
    )
    options.update(overrides)
    return AIOKafkaConsumer(*topic_names, **options)


async def assign_at_end(consumer: AIOKafkaConsumer, topic_names: Sequence[str]) -> None:
    """Every partition of ``topic_names``, positioned at its end now: nothing appended after this returns is
    missed. (A subscribed consumer with ``auto_offset_reset="latest"`` finds its end only at its first fetch,
    so records appended before that are skipped.)"""
    tps = []
    for topic in topic_names:
        tps += [TopicPartition(topic, p) for p in sorted(await topic_partitions(consumer, topic))]
    consumer.assign(tps)
    await consumer.seek_to_end(*tps)
    for tp in tps:
        await consumer.position(tp)


async def tail(bootstrap: str, *topic_names: str, **overrides: Any) -> AIOKafkaConsumer:
    """A started consumer outside any group, reading ``topic_names`` from their end now."""
    consumer = make_consumer(bootstrap, group_id=None, **overrides)
    await consumer.start()
    try:
        await assign_at_end(consumer, topic_names)
    except BaseException:
        await consumer.stop()
        raise
    return consumer


async def send(producer: AIOKafkaProducer, topic: str, event: Event, key: str, partition: int | None = None) -> Any:
    """Produce and wait for the broker's ack; returns the record metadata (offset, partition)."""
    return await producer.send_and_wait(topic, encode(event), key=key.encode(), partition=partition)


async def enqueue(producer: AIOKafkaProducer, topic: str, event: Event, key: str,
                  partition: int | None = None) -> asyncio.Future[Any]:
    """Hand the record to the producer and return the future of its ack without waiting for it: records
    enqueued one after another reach a partition in that order (idempotent producer), so a caller can
    produce several and wait once."""
    return await producer.send(topic, encode(event), key=key.encode(), partition=partition)


async def decode_or_deadletter(record: ConsumerRecord, producer: AIOKafkaProducer, topics: Topics, group: str,
                               types: tuple[type[Event], ...] = ALL_EVENTS) -> Event | None:
    """The event in ``record``, or None after the record has been dead-lettered."""
    try:
        return decode_record(record, types)
    except EventDecodeError as exc:
        await deadletter(record, producer, topics, group, str(exc))
        return None


async def deadletter(record: ConsumerRecord, producer: AIOKafkaProducer, topics: Topics, group: str,
                     error: str) -> None:
    event = deadletter_event(record, group, error)
    await send(producer, topics.deadletter, event, key=record.topic)
    log_deadlettered(event)


def deadletter_event(record: Any, group: str, error: str) -> EventDeadLettered:
    """The whole record, wrapped; ``record`` is an aiokafka ``ConsumerRecord`` or a faust message (same fields)."""
    raw = record.value.decode("utf-8", "replace") if record.value is not None else ""
    key = record.key.decode("utf-8", "replace") if record.key is not None else None
    return EventDeadLettered(source_topic=record.topic, partition=record.partition, offset=record.offset,
                             key=key, raw=raw, error=error, consumer_group=group)


def log_deadlettered(event: EventDeadLettered) -> None:
    log.warning("dead-lettered %s[%d]@%d for group %s: %s", event.source_topic, event.partition, event.offset,
                event.consumer_group, event.error)
