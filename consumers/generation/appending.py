"""The worker's Kafka producer and its acknowledgements: what it appended for a generation has landed, or is
kept unsettled until it has (or its producer was closed for good), and a producer stuck after every broker
restarted is replaced by a fresh one.

An idempotent aiokafka producer never expires a batch: an append to a partition whose broker lost the
producer's sequence would wait for good. ``landed`` waits at most ``ACK_TIMEOUT_S`` and keeps what is still
unacknowledged for the retry to ``settle`` before it reads the tokens it saved; ``renew`` swaps in a new
producer (a new producer id, sequences from 0) at most once per ``PRODUCER_RENEW_GAP_S``.
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import weakref
from typing import Any

from aiokafka.errors import KafkaTimeoutError

from topics.clients import make_producer
from topics.partitioning import partition_for

log = logging.getLogger(__name__)
ACK_TIMEOUT_S = 20.0  # an append or finish not acknowledged by then is retried through a new producer
PRODUCER_RENEW_GAP_S = 10.0


class Appender:
    def __init__(self, bootstrap: str, worker_id: str) -> None:
        self.bootstrap, self.worker_id = bootstrap, worker_id
        self.producer: Any = make_producer(bootstrap)
        self._renewed = 0.0
        self._lock = asyncio.Lock()
        # A failed attempt's appends not acknowledged yet, per generation, with the producer holding them; and
        # the producers closed for good (nothing they still held can land any more).
        self._unsettled: dict[str, tuple[Any, set[asyncio.Future[Any]]]] = {}
        self._closed: weakref.WeakSet[Any] = weakref.WeakSet()

    def partition(self, topic: str, key: str) -> int | None:
        """The partition Kafka's default partitioner gives ``key`` (murmur2, computed once per key), for a send
        that names it, so the producer does not hash every record of a reply; None until the topic's partitions
        are known (the producer then partitions by the key itself, to the same partition)."""
        cluster = getattr(getattr(self.producer, "client", None), "cluster", None)
        count = len(cluster.partitions_for_topic(topic) or ()) if cluster is not None else 0
        return partition_for(key, count) if count else None

    def forget(self, generation_id: str) -> None:
        """The generation is done here (served, or left to another owner)."""
        self._unsettled.pop(generation_id, None)

    async def landed(self, generation_id: str, futures: list[asyncio.Future[Any]]) -> None:
        """Wait for these appends' acks, at most ACK_TIMEOUT_S: an idempotent aiokafka producer never expires
        a batch, so an append to a partition whose broker lost the producer's sequence would otherwise wait for
        good. Those still unacknowledged are kept for the retry to settle, never cancelled: they may land yet."""
        if not futures:
            return
        done, waiting = await asyncio.wait(futures, timeout=ACK_TIMEOUT_S)
        if waiting:
            producer, held = self._unsettled.get(generation_id, (self.producer, set()))
            self._unsettled[generation_id] = (producer, {f for f in held if not f.done()} | waiting)
            raise KafkaTimeoutError(f"no ack within {ACK_TIMEOUT_S:.0f} s")
        for future in futures:
            failed = None if future.cancelled() else future.exception()
            if failed is not None:
                raise failed

    async def settle(self, generation_id: str) -> None:
        """Before a retried generation reads what it saved: every append of its failed attempt has landed or
        failed, or its producer was closed for good, so none can land behind the reading."""
        held = self._unsettled.get(generation_id)
        if held is None:
            return
        producer, futures = held
        waiting = {f for f in futures if not f.done()}
        if waiting and producer not in self._closed:
            _, waiting = await asyncio.wait(waiting, timeout=ACK_TIMEOUT_S)
            if waiting and producer not in self._closed:
                self._unsettled[generation_id] = (producer, waiting)
                raise KafkaTimeoutError(f"{len(waiting)} appends of the failed attempt still unacknowledged")
        del self._unsettled[generation_id]

    async def renew(self, exc: BaseException) -> None:
        """A new idempotent producer (a new producer id, sequences from 0). When every broker restarted while
        batches were in flight, the brokers keep an older sequence than the producer, and aiokafka retries
        those appends for good (OutOfOrderSequenceNumber); a request that failed on Kafka retries through a
        fresh producer, at most one renewal per PRODUCER_RENEW_GAP_S."""
        async with self._lock:
            if time.monotonic() - self._renewed < PRODUCER_RENEW_GAP_S:
                return
            fresh = make_producer(self.bootstrap)
            try:
                await fresh.start()
            except Exception as failed:  # noqa: BLE001 - Kafka still down: keep the old one, renew later
                with contextlib.suppress(Exception):
                    await fresh.stop()
                log.info("worker %s: no new Kafka producer yet (%s)", self.worker_id, type(failed).__name__)
                return
            old, self.producer = self.producer, fresh
            self._renewed = time.monotonic()
            log.warning("worker %s: new Kafka producer after %s", self.worker_id, type(exc).__name__)
            # Its batches land now (Kafka is back) or never: stopped in time, or closed for good. The retries
            # that settle on it wait here, so none reads its saved tokens while they may still land.
            try:
                await asyncio.wait_for(old.stop(), ACK_TIMEOUT_S)
            except Exception:  # noqa: BLE001 - still stuck: what it holds is what the retries replace
                await close_for_good(old)
            self._closed.add(old)


async def close_for_good(producer: Any) -> None:
    """Stop a producer's sender and close its connections without flushing: the batches it still holds are
    dropped, never sent (aiokafka's ``stop`` flushes first, and cancelled mid-flush leaves the sender running)."""
    sender = getattr(producer, "_sender", None)
    if sender is not None:
        with contextlib.suppress(Exception):
            await sender.close()
    client = getattr(producer, "client", None)
    if client is not None:
        with contextlib.suppress(Exception):
            await client.close()
