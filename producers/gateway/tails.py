"""The gateway's readers of ``chat.tokens``: its own partitions' tail, and tails it borrows.

A ``PartitionTail`` is one consumer without a group over some partitions, positioned at their end when it
starts, handing each fetched batch to the relay. The gateway runs one over the partitions it owns
(``ownership.py``) for its whole life. A stream of a partition it does not own (a resume after a reconnect
that the load balancer sent here, a retry of a message another gateway accepted) borrows a tail of that one
partition: the first such stream starts it, every later one shares it, and it closes ``linger_s`` after the
last one leaves, so a gateway reads another gateway's partition only while someone here reads from it.
"""
from __future__ import annotations

import asyncio
import contextlib
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field

from aiokafka import AIOKafkaConsumer, ConsumerRecord, TopicPartition

from producers.gateway.metrics import TAIL_RECORDS
from topics.clients import make_consumer, topic_partitions

Handler = Callable[[list[ConsumerRecord]], Awaitable[None]]


class PartitionTail:
    def __init__(self, bootstrap: str, topic: str, handle: Handler, read: Counter[int], kind: str) -> None:
        self.bootstrap, self.topic, self.handle, self.read = bootstrap, topic, handle, read
        self.counted = TAIL_RECORDS.labels(kind)
        self.consumer: AIOKafkaConsumer | None = None
        self.partitions: list[int] = []
        self._task: asyncio.Task[None] | None = None

    async def start(self, choose: Callable[[int], Iterable[int]]) -> int:
        """Tail the partitions ``choose(partition count)`` names from their end now; returns the count."""
        self.consumer = make_consumer(self.bootstrap, group_id=None)
        await self.consumer.start()
        count = len(await topic_partitions(self.consumer, self.topic))
        self.partitions = sorted(choose(count))
        tps = [TopicPartition(self.topic, p) for p in self.partitions]
        self.consumer.assign(tps)
        ends = await self.consumer.end_offsets(tps)
        for tp in tps:
            self.consumer.seek(tp, ends[tp])  # "end" resolved now: nothing produced after start() is missed
        self._task = asyncio.create_task(self._run(), name=f"token-tail-{self.partitions}")
        return count

    def quiet_s(self) -> float | None:
        """Seconds since Kafka last answered a fetch of these partitions (an idle long-poll counts: the broker
        answers every ``fetch_max_wait_ms``); None before the first answer. Read from the consumer's own
        bookkeeping: no request, no timer."""
        if self.consumer is None:
            return None
        heard = [self.consumer.last_poll_timestamp(TopicPartition(self.topic, p)) for p in self.partitions]
        known = [ms for ms in heard if ms]
        return max(0.0, time.time() - max(known) / 1000) if known else None

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self.consumer is not None:
            await self.consumer.stop()

    async def _run(self) -> None:
        assert self.consumer is not None
        while True:
            batch = await self.consumer.getmany(timeout_ms=200, max_records=5000)
            for tp, records in batch.items():
                self.read[tp.partition] += len(records)  # per batch, not per record
                self.counted.inc(len(records))
                await self.handle(records)


@dataclass
class Borrowed:
    """A borrowed tail of one partition and the streams here that read it."""

    tail: PartitionTail
    ready: asyncio.Future[int]
    users: int = 0
    release: asyncio.TimerHandle | None = None


@dataclass
class Borrowing:
    """The borrowed tails, one per partition, counted by the streams that use them."""

    bootstrap: str
    topic: str
    handle: Handler
    read: Counter[int]
    linger_s: float = 5.0
    tails: dict[int, Borrowed] = field(default_factory=dict)
    _closing: set[asyncio.Task[None]] = field(default_factory=set)

    def take(self, partition: int) -> None:
        """One more stream reads ``partition``: start its tail, or keep the running one open."""
        held = self.tails.get(partition)
        if held is None:
            tail = PartitionTail(self.bootstrap, self.topic, self.handle, self.read, "borrowed")
            held = self.tails[partition] = Borrowed(tail, asyncio.ensure_future(tail.start(lambda _n: [partition])))
        if held.release is not None:
            held.release.cancel()
            held.release = None
        held.users += 1

    def leave(self, partition: int) -> None:
        held = self.tails.get(partition)
        if held is None:
            return
        held.users -= 1
        if held.users <= 0 and held.release is None:
            held.release = asyncio.get_running_loop().call_later(self.linger_s, self._close, partition)

    async def ready(self, partition: int) -> None:
        """Returns once ``partition``'s borrowed tail is positioned (at once when none is borrowed)."""
        held = self.tails.get(partition)
        if held is not None:
            await asyncio.shield(held.ready)

    def _close(self, partition: int) -> None:
        held = self.tails.pop(partition, None)
        if held is None:
            return
        task = asyncio.ensure_future(self._stop(held))
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)

    @staticmethod
    async def _stop(held: Borrowed) -> None:
        with contextlib.suppress(Exception):  # a tail that never started has nothing else to stop
            await held.ready
        await held.tail.stop()

    async def stop(self) -> None:
        for partition in list(self.tails):
            held = self.tails[partition]
            if held.release is not None:
                held.release.cancel()
            self._close(partition)
        await asyncio.gather(*self._closing, return_exceptions=True)
