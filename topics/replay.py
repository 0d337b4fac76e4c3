"""Read a topic again from a point in time up to where it ends now.

The reaper reads ``chat.replies`` (the usage log) to settle expired reservations
with real numbers; ``parley billing replay`` reads ``usage`` to recompute totals.
No consumer group: replays are read-only audits and must not move anyone's offsets.
"""
from __future__ import annotations

import logging
from collections.abc import AsyncIterator

from aiokafka import TopicPartition

from schemas import Event, EventDecodeError, decode
from topics.clients import make_consumer, topic_partitions

log = logging.getLogger(__name__)


async def replay(bootstrap: str, topic: str, since_s: float, types: tuple[type[Event], ...],
                 until_s: float | None = None) -> AsyncIterator[Event]:
    """Events of ``types`` stamped at or after ``since_s`` (and before ``until_s``), partition by partition."""
    consumer = make_consumer(bootstrap, group_id=None, enable_auto_commit=False)
    await consumer.start()
    try:
        tps = [TopicPartition(topic, p) for p in sorted(await topic_partitions(consumer, topic))]
        consumer.assign(tps)
        starts = await consumer.offsets_for_times({tp: int(since_s * 1000) for tp in tps})
        ends = await consumer.end_offsets(tps)
        for tp in tps:
            found = starts.get(tp)
            if found is None or found.offset >= ends[tp]:
                continue  # nothing stamped after since_s in this partition
            consumer.seek(tp, found.offset)
            async for event in _until(consumer, tp, ends[tp], types, until_s):
                yield event
    finally:
        await consumer.stop()


async def _until(consumer: object, tp: TopicPartition, end: int, types: tuple[type[Event], ...],
                 until_s: float | None) -> AsyncIterator[Event]:
    position = await consumer.position(tp)  # type: ignore[attr-defined]
    idle = 0
    while position < end and idle < 5:  # offsets below end may be gone (retention): stop, do not spin
        batch = await consumer.getmany(tp, timeout_ms=1000, max_records=500)  # type: ignore[attr-defined]
        idle = 0 if batch.get(tp) else idle + 1
        for record in batch.get(tp, []):
            position = record.offset + 1
            if record.offset >= end or (until_s is not None and record.timestamp >= until_s * 1000):
                return
            try:
                yield decode(record.value, types)
            except EventDecodeError as exc:  # a stage dead-letters these; an audit only skips them
                log.debug("replay of %s skipped offset %d: %s", tp, record.offset, exc)
