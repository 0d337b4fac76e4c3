"""Reading a topic without a consumer group: one helper for every reader that assigns partitions itself.

``open_reader`` assigns every partition of a topic (or only the one a key lands on), notes where each ends
now, and positions each at the first record stamped at or after a time. The gateway's token relay tails
``chat.tokens`` and replays one generation from it; the worker follows ``chat.control`` and reads back the
tokens another worker saved; the reaper reads ``chat.replies`` (the usage log) to settle expired reservations
with real numbers; ``parley billing replay`` reads ``usage`` to recompute totals. None of them may move
anyone's offsets, so none has a group.
"""
from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from aiokafka import AIOKafkaConsumer, ConsumerRecord, TopicPartition

from schemas import Event, EventDecodeError, decode_record
from topics.clients import make_consumer, topic_partitions
from topics.partitioning import partition_for

log = logging.getLogger(__name__)


@dataclass
class Reader:
    consumer: AIOKafkaConsumer
    partitions: list[TopicPartition]
    ends: dict[TopicPartition, int]  # the end of each partition when the reader was opened

    async def close(self) -> None:
        await self.consumer.stop()


async def open_reader(bootstrap: str, topic: str, *, since_ms: int | None = None, key: str | None = None,
                      **overrides: Any) -> Reader:
    """A started consumer without a group, assigned ``topic``'s partitions (only ``key``'s when given), each
    positioned at the first record stamped at or after ``since_ms`` or at its end when there is none.
    ``since_ms=None`` leaves the positions to the caller. Close it with ``Reader.close``."""
    consumer = make_consumer(bootstrap, group_id=None, **overrides)
    await consumer.start()
    try:
        parts = sorted(await topic_partitions(consumer, topic))
        chosen = [partition_for(key, len(parts))] if key is not None else parts
        tps = [TopicPartition(topic, p) for p in chosen]
        consumer.assign(tps)
        ends = await consumer.end_offsets(tps)
        if since_ms is not None:
            found = await consumer.offsets_for_times({tp: max(since_ms, 0) for tp in tps})
            for tp in tps:
                consumer.seek(tp, found[tp].offset if found.get(tp) is not None else ends[tp])
    except BaseException:
        await consumer.stop()
        raise
    return Reader(consumer, tps, ends)


async def read_to_end(reader: Reader, tp: TopicPartition, *, timeout_ms: int = 1000,
                      max_idle: int = 5) -> AsyncIterator[ConsumerRecord]:
    """The records of ``tp`` from its position up to where it ended when the reader was opened. Offsets below
    the end may be gone (retention, compaction): after ``max_idle`` empty fetches it stops rather than spin."""
    end = reader.ends[tp]
    position = await reader.consumer.position(tp)
    idle = 0
    while position < end and idle < max_idle:
        batch = await reader.consumer.getmany(tp, timeout_ms=timeout_ms, max_records=500)
        idle = 0 if batch.get(tp) else idle + 1
        for record in batch.get(tp, []):
            position = record.offset + 1
            if record.offset >= end:
                return
            yield record


async def replay(bootstrap: str, topic: str, since_s: float, types: tuple[type[Event], ...],
                 until_s: float | None = None) -> AsyncIterator[Event]:
    """Events of ``types`` stamped at or after ``since_s`` (and before ``until_s``), partition by partition."""
    reader = await open_reader(bootstrap, topic, since_ms=int(since_s * 1000))
    try:
        for tp in reader.partitions:
            async for record in read_to_end(reader, tp):
                if until_s is not None and record.timestamp >= until_s * 1000:
                    break
                try:
                    yield decode_record(record, types)
                except EventDecodeError as exc:  # a stage dead-letters these; an audit only skips them
                    log.debug("replay of %s skipped offset %d: %s", tp, record.offset, exc)
    finally:
        await reader.close()
