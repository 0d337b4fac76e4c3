"""The loop every aiokafka stage shares: poll, decode (or dead-letter), handle, produce, commit.

A handler is ``async (event) -> list[Out]``; the loop produces its outputs and
commits the record's offset only after they are acknowledged, so a crash
re-handles a record (handlers are idempotent) but never loses one. Partitions
are handled concurrently, records within one partition in order.
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
from infra.stores.retry import until_stored
from schemas import Event
from topics import Topics
from topics.clients import deadletter, decode_or_deadletter, enqueue, make_consumer, make_producer

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Out:
    topic: str
    event: Event
    key: str
    partition: int | None = None  # None: by key (murmur2), as every reader of the topic expects


Handler = Callable[[Any], Awaitable[list[Out]]]


class Stage:
    def __init__(self, name: str, settings: Settings, topic_attr: str, types: tuple[type[Event], ...],
                 handler: Handler, *, per_key: bool = False, **consumer_options: Any) -> None:
        """``per_key``: records of one partition with different keys are handled concurrently (in order per
        key), for a handler whose order only matters per key and whose time is mostly waiting on I/O."""
        self.name, self.settings, self.types, self.handler = name, settings, types, handler
        self.per_key = per_key
        self.topics = Topics(settings.topic_prefix)
        self.group = f"{settings.topic_prefix}{name}"
        self._topic_attr, self._consumer_options = topic_attr, consumer_options
        self._stopping = asyncio.Event()
        self.reset()

    def reset(self) -> None:
        """Fresh Kafka clients (a stopped aiokafka client cannot start again), for a restart after a failure."""
        self.producer = make_producer(self.settings.kafka_bootstrap)
        self.consumer = make_consumer(self.settings.kafka_bootstrap, getattr(self.topics, self._topic_attr),
                                      group_id=self.group, **self._consumer_options)

    async def run(self) -> None:
        await self.producer.start()
        await self.consumer.start()
        log.info("stage %s consuming %s", self.name, self.consumer.subscription())
        try:
            while not self._stopping.is_set():
                batch = await self.consumer.getmany(timeout_ms=100, max_records=200)
                if batch:
                    await asyncio.gather(*(self._partition(tp, records) for tp, records in batch.items()))
        finally:
            await self.consumer.stop()
            await self.producer.stop()

    def stop(self) -> None:
        self._stopping.set()

    async def _partition(self, tp: TopicPartition, records: list[Any]) -> None:
        if self.per_key and len(records) > 1:
            by_key: dict[bytes | None, list[Any]] = {}
            for record in records:
                by_key.setdefault(record.key, []).append(record)
            acks = [a for group in await asyncio.gather(*(self._handle(g) for g in by_key.values())) for a in group]
        else:
            acks = await self._handle(records)
        await asyncio.gather(*acks)
        # One commit per partition batch, after every output is acknowledged: a crash re-handles at most
        # this batch (handlers are idempotent), and a single message pays one commit, not one per hop.
        await self.consumer.commit({tp: records[-1].offset + 1})

    async def _handle(self, records: list[Any]) -> list[asyncio.Future[Any]]:
        """Handle ``records`` in order; the acks of their outputs, still in flight."""
        acks: list[asyncio.Future[Any]] = []
        for record in records:
            event = await decode_or_deadletter(record, self.producer, self.topics, self.group, self.types)
            if event is not None:
                began = time.time()
                try:  # a store outage is waited out right here: this record and its offset keep their place
                    outs = await until_stored(self.name, self.handler, event)
                except Exception as exc:  # noqa: BLE001 - a poison record: dead-lettered with its error, not fatal
                    log.exception("stage %s offset %d: handler failed; dead-lettering the record", self.name,
                                  record.offset)
                    await deadletter(record, self.producer, self.topics, self.group, f"{type(exc).__name__}: {exc}")
                    continue
                # Outputs go out together and in order; the next record is handled while they are in flight.
                for out in outs:
                    acks.append(await enqueue(self.producer, out.topic, out.event, out.key, out.partition))
                if log.isEnabledFor(logging.DEBUG):
                    log.debug("stage %s offset %d: fetched %.1f ms after produce, handled in %.1f ms", self.name,
                              record.offset, (began - record.timestamp / 1000) * 1000, (time.time() - began) * 1000)
        return acks


async def run_stages(*stages: Any, restart_s: float = 1.0, max_restart_s: float = 30.0) -> None:
    """Run stages together until stopped. A stage that fails is restarted after a backoff, alone: one
    stage's failure never stops the others (store outages are waited out inside each stage)."""
    tasks = [asyncio.create_task(_keep_running(s, restart_s, max_restart_s), name=getattr(s, "name", "stage"))
             for s in stages]
    try:
        await asyncio.gather(*tasks)
    finally:
        for s in stages:
            s.stop()
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def _keep_running(stage: Any, first_s: float, max_s: float) -> None:
    """``stage.run()`` until it returns (stopped); restarted with backoff when it raises."""
    delay, name = first_s, getattr(stage, "name", type(stage).__name__)
    while True:
        began = time.monotonic()
        try:
            await stage.run()
            return
        except asyncio.CancelledError:
            raise
        except Exception:  # noqa: BLE001 - logged whole; the stage restarts, the others run on
            log.exception("stage %s failed; restarting it in %.1f s (the other stages carry on)", name, delay)
        if time.monotonic() - began > 60:
            delay = first_s  # it ran a good while: this is a fresh failure, not a crash loop
        await asyncio.sleep(delay)
        delay = min(delay * 2, max_s)
        if hasattr(stage, "reset"):
            stage.reset()
