"""Which requests a worker takes next: the paid lane first, never more than its free slots, and offsets
committed only past requests that have finished (``OffsetTracker``), so a request a worker let go of (a
rebalance, a crash, an engine that died) is read again by the partition's next owner.

The paid lane is fetched on its own first; while its records may exist but are not fetched yet, the free
lane stays paused, however slow the fetch. Once the paid lane is drained, both lanes are waited on at once,
so whichever record comes first is picked up the moment its fetch answers.
"""
from __future__ import annotations

import asyncio
import logging
from typing import Any

from aiokafka import TopicPartition
from aiokafka.errors import KafkaError

from consumers.generation.offsets import OffsetTracker

log = logging.getLogger(__name__)
PAID_FETCH_MS = 50  # the paid lane's records are known to be there: a short wait for their fetch
BOTH_LANES_MS = 200  # nothing paid is waiting: how long one poll waits on both lanes
NO_PARTITIONS_S = 0.05  # the group is still assigning partitions, or a rebalance moved them mid-poll


def request_key(tp: TopicPartition, offset: int) -> str:
    """A request's key while it runs: its lane's topic, partition and offset."""
    return f"{partition_prefix(tp)}{offset}"


def partition_prefix(tp: TopicPartition) -> str:
    """What the keys of every request of one partition start with (``rebalance.let_go`` looks them up by it)."""
    return f"{tp.topic}:{tp.partition}:"


def paid_first(got: dict[TopicPartition, list[Any]], paid: str) -> list[tuple[TopicPartition, Any]]:
    """The records of one poll in the order they are served: every paid partition's before any free one's, each
    partition's in offset order."""
    order = sorted(got.items(), key=lambda item: (item[0].topic != paid, item[0].partition))
    return [(tp, record) for tp, records in order for record in records]


class Intake:
    def __init__(self, consumer: Any, paid: str, free: str) -> None:
        self.consumer, self.paid, self.free = consumer, paid, free
        self.tracker = OffsetTracker()

    def hold(self) -> None:
        """No free slot: fetch nothing more (the group still hears this member's heartbeats)."""
        self.consumer.pause(*self.consumer.assignment())

    async def take(self, slots: int) -> list[tuple[TopicPartition, Any]]:
        """Up to ``slots`` requests, paid first, each marked started; [] when a rebalance interrupted the poll."""
        self.consumer.resume(*self.consumer.assignment())
        try:
            polled = await self._poll(slots)
        except (AssertionError, KafkaError) as exc:  # a rebalance moved partitions mid-poll: poll again
            log.info("poll interrupted by a rebalance: %s", type(exc).__name__)
            polled = []
            await asyncio.sleep(NO_PARTITIONS_S)
        for tp, record in polled:
            self.tracker.started(tp, record.offset)
        return polled

    def finished(self, tp: TopicPartition, offset: int) -> None:
        self.tracker.finished(tp, offset)

    def forget(self, revoked: set[TopicPartition]) -> None:
        self.tracker.forget(revoked)

    async def commit(self) -> None:
        offsets = self.tracker.committable()
        if not offsets:
            return
        try:
            await self.consumer.commit(offsets)
            self.tracker.mark_committed(offsets)
        except Exception as exc:  # noqa: BLE001 - a failed commit is retried on the next pass
            log.warning("commit failed, will retry: %s", exc)

    async def _poll(self, slots: int) -> list[tuple[TopicPartition, Any]]:
        assignment = self.consumer.assignment()
        paid = [tp for tp in assignment if tp.topic == self.paid]
        free = [tp for tp in assignment if tp.topic == self.free]
        if paid:
            got = await self.consumer.getmany(*paid, timeout_ms=0, max_records=slots)
            if not got and await self._paid_waiting(paid):
                # Paid records may exist but are not fetched yet: hold the free lane until the paid
                # lane is known to be empty, however slow the fetch (a busy machine, a fresh start).
                self.consumer.pause(*free)
                got = await self.consumer.getmany(*paid, timeout_ms=PAID_FETCH_MS, max_records=slots)
                return paid_first(got, self.paid)
            if got:
                return paid_first(got, self.paid)
        if not paid and not free:
            await asyncio.sleep(NO_PARTITIONS_S)
            return []
        self.consumer.resume(*free)
        got = await self.consumer.getmany(*paid, *free, timeout_ms=BOTH_LANES_MS, max_records=slots)
        return paid_first(got, self.paid)

    async def _paid_waiting(self, paid: list[TopicPartition]) -> bool:
        for tp in paid:
            high = self.consumer.highwater(tp)
            if high is None or high > await self.consumer.position(tp):
                return True  # unknown until the first fetch answers: assume paid work may be there
        return False
