"""The loop every aiokafka stage shares: poll, decode (or dead-letter), handle, produce, commit.

A handler is ``async (event) -> list[Out]``; the loop produces its outputs and
commits the record's offset only after they are acknowledged, so a crash
re-handles a record (handlers are idempotent) but never loses one. Offsets are
committed at most every ``COMMIT_EVERY_S`` (and as the stage stops), not once per
batch: at a few requests a second a batch was one message, and each of the six
stages' commits a request for the broker to write and replicate. Partitions
are handled concurrently, records within one partition in order. With a ``Sealer``
the handler sees opened events and its outputs are sealed on the way out; a record
of a conversation whose data key is gone (deleted) is skipped.
"""
from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from aiokafka import TopicPartition

from infra.config.settings import Settings
from infra.stores.crypto import KeyGone
from infra.stores.retry import until_stored
from infra.stores.sealing import Sealer
from schemas import Event
from topics import Role, Topics
from topics.clients import (
    STEADY_FETCH_WAIT_MS,
    deadletter,
    decode_or_deadletter,
    enqueue,
    make_consumer,
    make_producer,
)
from topics.metrics import STAGE_HANDLE_SECONDS, STAGE_RECORDS
from topics.runner import Runner

log = logging.getLogger(__name__)

# How long a handled record's offset may wait to be committed: a crash or a rebalance re-handles at most this
# much more (handlers are idempotent), and a stage commits at most twice a second whatever its rate.
COMMIT_EVERY_S = 0.5


@dataclass(frozen=True)
class Out:
    topic: str
    event: Event
    key: str
    partition: int | None = None  # None: by key (murmur2), as every reader of the topic expects


Handler = Callable[[Any], Awaitable[list[Out]]]


class Stage(Runner):
    def __init__(self, role: Role, settings: Settings, types: tuple[type[Event], ...], handler: Handler, *,
                 per_key: bool = False, sealer: Sealer | None = None, on_moved: Callable[[], None] | None = None,
                 **consumer_options: Any) -> None:
        """Consumes the first topic ``role`` reads, in the stage's own group. ``per_key``: records of one
        partition with different keys are handled concurrently (in order per key), for a handler whose order
        only matters per key and whose time is mostly waiting on I/O. ``on_moved``: called when the partitions
        assigned to this process change (before their records are handled), for a handler that keeps what it
        wrote for the keys of its partitions."""
        super().__init__()
        self.name, self.settings, self.types, self.handler = role.stage, settings, types, handler
        self.per_key, self.sealer, self.on_moved = per_key, sealer, on_moved
        self._assigned: set[TopicPartition] = set()
        self._to_commit: dict[TopicPartition, int] = {}  # handled, outputs acknowledged, not yet committed
        self._committed_at = 0.0
        self.topics = Topics(settings.topic_prefix)
        self.group = self.topics.group(role.stage)
        self._source, self._consumer_options = getattr(self.topics, role.reads[0].attr), consumer_options
        self.reset()
        self._handled = STAGE_RECORDS.labels(stage=self.name, outcome="handled")
        self._deadlettered = STAGE_RECORDS.labels(stage=self.name, outcome="deadlettered")
        self._seconds = STAGE_HANDLE_SECONDS.labels(stage=self.name)

    def reset(self) -> None:
        """Fresh Kafka clients (a stopped aiokafka client cannot start again), for a restart after a failure."""
        self.producer = make_producer(self.settings.kafka_bootstrap)
        self.consumer = make_consumer(self.settings.kafka_bootstrap, self._source, group_id=self.group,
                                      **({"fetch_max_wait_ms": STEADY_FETCH_WAIT_MS} | self._consumer_options))

    def clients(self) -> list[Any]:
        return [self.producer, self.consumer]

    async def step(self) -> None:
        batch = await self.consumer.getmany(timeout_ms=100, max_records=200)
        if self.on_moved is not None and (assigned := self.consumer.assignment()) != self._assigned:
            self._assigned = set(assigned)
            self.on_moved()
        if batch:
            await asyncio.gather(*(self._partition(tp, records) for tp, records in batch.items()))
        await self._commit()

    async def _loop(self) -> None:
        await super()._loop()
        await self._commit(now=True)  # stopping: what was handled is not handled again by the next owner

    async def _commit(self, now: bool = False) -> None:
        """Commit what was handled, once ``COMMIT_EVERY_S`` has passed since the last commit (or ``now``). A
        partition taken away meanwhile is left to its new owner, which re-handles from its last commit."""
        if not self._to_commit or (not now and time.monotonic() - self._committed_at < COMMIT_EVERY_S):
            return
        assigned = self.consumer.assignment()
        offsets = {tp: o for tp, o in self._to_commit.items() if tp in assigned}
        self._to_commit, self._committed_at = {}, time.monotonic()
        if offsets:
            await self.consumer.commit(offsets)

    async def _partition(self, tp: TopicPartition, records: list[Any]) -> None:
        if self.per_key and len(records) > 1:
            by_key: dict[bytes | None, list[Any]] = {}
            for record in records:
                by_key.setdefault(record.key, []).append(record)
            acks = [a for group in await asyncio.gather(*(self._handle(g) for g in by_key.values())) for a in group]
        else:
            acks = await self._handle(records)
        await asyncio.gather(*acks)
        # Committed once every output is acknowledged, with the other partitions' (``_commit``).
        self._to_commit[tp] = records[-1].offset + 1

    async def _handle(self, records: list[Any]) -> list[asyncio.Future[Any]]:
        """Handle ``records`` in order; the acks of their outputs, still in flight."""
        acks: list[asyncio.Future[Any]] = []
        for record in records:
            event = await decode_or_deadletter(record, self.producer, self.topics, self.group, self.types)
            if event is None:
                self._deadlettered.inc()
            else:
                began = time.time()
                try:  # a store outage is waited out right here: this record and its offset keep their place
                    outs = await until_stored(self.name, self._apply, event)
                except KeyGone as gone:
                    log.info("stage %s offset %d skipped: conversation %s deleted", self.name, record.offset,
                             gone.conversation_id)
                    continue
                except Exception as exc:  # noqa: BLE001 - a poison record: dead-lettered with its error, not fatal
                    log.exception("stage %s offset %d: handler failed; dead-lettering the record", self.name,
                                  record.offset)
                    await deadletter(record, self.producer, self.topics, self.group, f"{type(exc).__name__}: {exc}")
                    self._deadlettered.inc()
                    continue
                # Outputs go out together and in order; the next record is handled while they are in flight.
                for out in outs:
                    acks.append(await enqueue(self.producer, out.topic, out.event, out.key, out.partition))
                self._handled.inc()
                self._seconds.observe(time.time() - began)
                if log.isEnabledFor(logging.DEBUG):
                    log.debug("stage %s offset %d: fetched %.1f ms after produce, handled in %.1f ms", self.name,
                              record.offset, (began - record.timestamp / 1000) * 1000, (time.time() - began) * 1000)
        return acks

    async def _apply(self, event: Event) -> list[Out]:
        return await self._sealed(await self.handler(await self._open(event)))

    async def _open(self, event: Event) -> Event:
        return await self.sealer.open(event) if self.sealer else event

    async def _sealed(self, outs: list[Out]) -> list[Out]:
        if self.sealer is None:
            return outs
        return [Out(o.topic, await self.sealer.seal(o.event), o.key, o.partition) for o in outs]
