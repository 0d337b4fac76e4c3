"""Generation worker (group ``generation.<pool>``): consumes ``generate.<pool>.paid`` then ``.free``,
runs each request on the engine, appends ``GenerationStarted`` / ``TokensAppended`` /
``GenerationFinished`` to ``chat.tokens`` and the finish to ``chat.replies``.

Hears every ``CancelRequested`` on ``chat.control`` (no group: a broadcast) and aborts
the sequence before the engine's next step. The output safety check runs here, beside the
engine loop (``consumers/safety/output.py``): a flagged chunk aborts the sequence the same way,
then ``GenerationRetracted`` and a ``blocked`` finish go out. Offsets are committed only past requests
that have finished. A redelivered request that another worker had started is
continued from the tokens it saved. Prompts arrive sealed and tokens leave sealed with
the conversation's data key (a request that came unsealed, from a tool that wrote it
by hand, is answered unsealed); a request whose conversation was deleted (key gone)
ends at once as ``stopped`` with no text.
"""
from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
from typing import Any

import redis.asyncio as aioredis
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.errors import KafkaError

from consumers.generation import assignor
from consumers.generation.announce import Announcer
from consumers.generation.appending import Appender
from consumers.generation.cancels import Cancels
from consumers.generation.coalescing import FlushPolicy, Pace
from consumers.generation.decisions import (
    STALE_REQUEST_S,
    Finish,
    Limits,
    decide,
    is_stale,
)
from consumers.generation.engine import EngineDead
from consumers.generation.fencing import Fence
from consumers.generation.finishing import Finisher
from consumers.generation.flush_clock import FlushClock
from consumers.generation.intake import Intake, request_key
from consumers.generation.metrics import WorkerMetrics
from consumers.generation.rebalance import Rebalance
from consumers.generation.recovery import Saved, read_saved
from consumers.generation.reply_run import RETRYABLE, ReplyRun
from consumers.safety.metrics import SafetyMetrics
from consumers.safety.output import OutputCheck
from infra.config.plans import Plan, load_plans
from infra.config.settings import Settings
from infra.stores.crypto import KeyGone
from infra.stores.finished import FinishedReplies
from infra.stores.quota import Quota
from infra.stores.retry import FIRST_DELAY_S, MAX_DELAY_S, dependency_of
from infra.stores.sealing import Sealer, is_sealed
from schemas import (
    GenerationRequested,
)
from topics import GENERATE, Role, Topics
from topics.catalogue import CONTROL, DEADLETTER, GENERATION, REPLIES, TOKENS
from topics.clients import decode_or_deadletter, make_consumer

log = logging.getLogger(__name__)
# Reads chat.control (broadcast) and its own earlier tokens on chat.tokens (recovery), without a group.
ROLE = Role(GENERATION, reads=(GENERATE, CONTROL, TOKENS), writes=(TOKENS, REPLIES, DEADLETTER))
# A dead worker's hand-over: the group coordinator evicts a member that sent no heartbeat for SESSION_TIMEOUT_MS
# (6 s, the broker's default floor, group.min.session.timeout.ms) and the rebalance gives its partitions to the
# pool's other replicas, which resume its replies from their saved tokens; the longest stall is this, the
# rebalance and one prefill. Lower would evict a worker whose loop a loaded machine starves for a few seconds.
SESSION_TIMEOUT_MS, HEARTBEAT_MS = 6_000, 1_000


class GenerationWorker:
    def __init__(self, settings: Settings, limits: Limits, engine: Any, capacity: int,
                 worker_id: str | None = None, metrics_port: int | None = None,
                 on_ready: Any = None, classifier: Any = None, metrics_host: str = "127.0.0.1",
                 sealer: Sealer | None = None, plans: dict[str, Plan] | None = None,
                 flush: FlushPolicy = FlushPolicy(), stand_in_from: str = "") -> None:
        """``stand_in_from``: the pool whose engine this worker runs when it stands in for ``limits.pool``
        (consumers/generation/standin.py); "" for one of the pool's own replicas."""
        self.on_ready, self.sealer, self.flush, self.stand_in_from = on_ready, sealer, flush, stand_in_from
        self.clock = FlushClock(flush)
        self.pace = Pace()  # the engine's recent time per token: each reply's stream interval
        self.sealing: set[str] = set()  # generations whose request came sealed: their tokens leave sealed
        self.settings, self.limits, self.engine, self.capacity = settings, limits, engine, capacity
        self.worker_id = worker_id or f"{limits.pool}-{socket.gethostname()}-{os.getpid()}"
        self.topics = Topics(settings.topic_prefix)
        self.group = self.topics.group(GENERATION, limits.pool)
        self.paid, self.free = self.topics.generate(limits.pool, "paid"), self.topics.generate(limits.pool, "free")
        self.metrics = WorkerMetrics(limits.pool, settings.gpu_hour_usd, settings.gpus_per_worker)
        self.metrics_port, self.metrics_host = metrics_port, metrics_host
        self.safety = None if classifier is None else OutputCheck(classifier, SafetyMetrics.of(self.metrics.registry))
        self.active: dict[str, asyncio.Task[None]] = {}
        self.cancels = Cancels(lambda gid: self.engine.abort(gid))  # heard on chat.control, maybe before their request
        self._slot_freed = asyncio.Event()
        self._stopping = asyncio.Event()
        self.engine_failure: EngineDead | None = None  # set when the engine died: the worker exits non-zero
        self.appender = Appender(settings.kafka_bootstrap, self.worker_id)
        self.consumer: AIOKafkaConsumer = make_consumer(
            settings.kafka_bootstrap, group_id=self.group, max_poll_interval_ms=600_000,
            session_timeout_ms=SESSION_TIMEOUT_MS, heartbeat_interval_ms=HEARTBEAT_MS,
            partition_assignment_strategy=assignor.strategies(self.worker_id))  # partitions stay put (assignor.py)
        self.intake = Intake(self.consumer, self.paid, self.free)
        self.redis = aioredis.Redis.from_url(settings.redis_url)
        self.quota = Quota.configured(self.redis, plans or load_plans(settings.plans_file), settings)
        self.fence = Fence(self.redis)
        self.finisher = Finisher(limits, self.worker_id, self.topics, self.appender, self.fence, self.quota,
                                 FinishedReplies(self.redis), self.metrics, self.seal)

    @property
    def producer(self) -> Any:
        """The appender's current producer (renewed after a Kafka outage)."""
        return self.appender.producer

    @producer.setter
    def producer(self, producer: Any) -> None:
        self.appender.producer = producer

    # -- lifecycle ---------------------------------------------------------------------------------------
    async def run(self) -> None:
        await self.producer.start()
        self.consumer.subscribe([self.paid, self.free], listener=Rebalance(self))
        await self.consumer.start()
        if self.metrics_port is not None:
            self.metrics_port = self.metrics.serve(self.metrics_port, self.metrics_host)
        control = asyncio.create_task(self.cancels.follow(self.settings.kafka_bootstrap, self.topics.control),
                                      name="control")
        clock = asyncio.create_task(self.clock.run(), name="flush-clock")
        stats = asyncio.create_task(self.metrics.watch(self.engine, lambda: len(self.active)), name="stats")
        announce = asyncio.create_task(Announcer(self.redis, self.group, self.worker_id, self.consumer, self.engine,
                                                 lambda: len(self.active), self.stand_in_from).run(), name="announce")
        log.info("worker %s serving pool %s, capacity %d, metrics on port %s", self.worker_id, self.limits.pool,
                 self.capacity, self.metrics_port)
        if self.on_ready is not None:
            self.on_ready(self)
        try:
            await self._fetch_loop()
        finally:
            control.cancel()
            clock.cancel()
            stats.cancel()
            announce.cancel()
            await asyncio.gather(announce, return_exceptions=True)  # withdrawn before the store closes
            await self._shutdown()

    def stop(self) -> None:
        self._stopping.set()

    def engine_died(self, exc: EngineDead) -> None:
        """The engine is gone (its process killed, out of memory): failing every request it is handed would
        drain the queues into failed replies. The worker stops instead, leaving them uncommitted; its
        supervisor starts it again (``engine_failure`` makes the exit non-zero) and the pool's other replicas
        take its partitions meanwhile."""
        if self.engine_failure is None:
            log.error("worker %s stopping: its engine is dead (%s); unfinished replies are left for the next "
                      "owner", self.worker_id, exc)
        self.engine_failure = exc
        self.stop()

    async def _shutdown(self) -> None:
        for task in list(self.active.values()):
            task.cancel()  # not finished: left uncommitted for the next owner to resume
        await asyncio.gather(*self.active.values(), return_exceptions=True)
        await self.intake.commit()
        await self.consumer.stop()
        await self.producer.stop()
        await self.redis.aclose()

    # -- fetching: paid lane first, never more than the engine batches (intake.py) -------------------------
    async def _fetch_loop(self) -> None:
        while not self._stopping.is_set():
            slots = self.capacity - len(self.active)
            if slots <= 0:
                self.intake.hold()
                self._slot_freed.clear()
                await _wait_any(self._slot_freed, self._stopping, timeout=1.0)
                await self.intake.commit()
                continue
            for tp, record in await self.intake.take(slots):
                key = request_key(tp, record.offset)
                if key in self.active:
                    continue  # re-fetched after a rebalance while still running here: one task per request
                self.active[key] = asyncio.create_task(self._serve(tp, record))
                self.metrics.active(len(self.active))
            await self.intake.commit()

    # -- one request -------------------------------------------------------------------------------------
    async def _serve(self, tp: TopicPartition, record: Any) -> None:
        key = request_key(tp, record.offset)
        done = True
        try:
            req = await decode_or_deadletter(record, self.producer, self.topics, self.group, (GenerationRequested,))
            if isinstance(req, GenerationRequested):  # else dead-lettered (decoded as nothing else)
                if self.sealer is not None and is_sealed(req.prompt_token_ids):
                    self.sealing.add(req.generation_id)
                try:
                    await self._until_served(req)
                except KeyGone:
                    await self._deleted(req)
                finally:
                    self.sealing.discard(req.generation_id)
        except asyncio.CancelledError:
            done = False  # let go (rebalance, shutdown): uncommitted, so the next owner resumes it
            raise
        except EngineDead as exc:
            done = False  # uncommitted: resumed from its saved tokens by the restarted worker or another replica
            self.engine_died(exc)
        except Exception:  # noqa: BLE001 - one bad request must not take the worker down
            log.exception("request at %s failed outside the engine", key)
        finally:
            if done:
                self.intake.finished(tp, record.offset)
            self.active.pop(key, None)
            self.metrics.active(len(self.active))
            self._slot_freed.set()

    async def _until_served(self, req: GenerationRequested) -> None:
        """Serve ``req``; while Redis, Kafka or the key store is unreachable, wait and serve it again from the
        tokens it saved. The request keeps its place meanwhile (its offset is not committed), so an outage
        pauses a reply instead of dropping it with its client left waiting and its reservation held.

        Fencing: this worker takes the generation once (a worker that held it before, presumed dead and then
        woken, finds a newer epoch and stops; every reader ignores its older epoch). A retry keeps that epoch
        and first checks it still holds it: a worker that was paused by the outage and taken over meanwhile
        leaves the generation to its new owner.

        A retry reads the saved tokens only once the failed attempt's appends are settled (``Appender.settle``): an
        idempotent producer retries a batch until it lands, so appends that were not acknowledged during the
        outage reach the log after it. Resuming before them wrote a second set of tokens at the same seqs,
        and the clients, shown the first, ended with text other than the saved reply."""
        picked_at = time.time()
        self.metrics.picked(req.lane, req.enqueued_at, picked_at)
        delay, began = FIRST_DELAY_S, 0.0
        started: int | None = None  # the started marker as taking the generation on found it
        try:
            while True:
                try:
                    await self.appender.settle(req.generation_id)
                    opened = await self._open(req)
                    if not self.fence.epoch(req.generation_id):
                        _, started = await self.fence.take(req.generation_id, int(picked_at * 1000))
                    elif await self.fence.fenced(req.generation_id):
                        return  # taken over while this worker waited: the new owner serves it
                    else:  # a retry: the marker is set now (the first try's own, when none was before it)
                        started = started if started is not None else int(picked_at * 1000)
                    await self._generate_owned(opened, picked_at, started)
                    if began:
                        log.info("generation %s served after waiting %.1f s for a store", req.generation_id,
                                 time.monotonic() - began)
                    return
                except RETRYABLE as exc:
                    if isinstance(exc, KafkaError):
                        await self.appender.renew(exc)
                    if not began:
                        began = time.monotonic()
                        store = "Kafka" if isinstance(exc, KafkaError) else dependency_of(exc)
                        log.warning("generation %s paused: %s unreachable (%s); resuming it from its saved "
                                    "tokens when it is back", req.generation_id, store, type(exc).__name__)
                    self.metrics.store_waits.inc()
                    await asyncio.sleep(delay)
                    delay = min(delay * 2, MAX_DELAY_S)
        finally:
            self.fence.release(req.generation_id)
            self.appender.forget(req.generation_id)

    async def _generate_owned(self, req: GenerationRequested, picked_at: float, started: int | None) -> None:
        if is_stale(req, picked_at):
            # Older than the token buffer: whatever happened to it can no longer be resumed or shown, and a
            # reply saved for it must not be overwritten (a new consumer group starts from the lane's start).
            log.warning("generation %s skipped: requested %.0f s ago, past the token buffer's %d s",
                        req.generation_id, picked_at - req.at, STALE_REQUEST_S)
            return
        saved = await self._saved(req, started)
        decision = decide(req, self.limits, req.generation_id in self.cancels, saved)
        if isinstance(decision, Finish):
            await self.finisher.early(req, decision, saved)
            return
        if decision.resumed:
            self.metrics.recoveries.inc()
            log.info("generation %s resumed at seq %d with %d saved tokens", req.generation_id,
                     decision.first_seq, len(saved.token_ids))
        await ReplyRun(self, req, decision, saved, picked_at).stream()

    async def _saved(self, req: GenerationRequested, started: int | None) -> Saved:
        """The tokens an earlier owner (or an earlier try of this one) saved, read from ``started``, the started
        marker (None: nothing can have been appended yet)."""
        if started is None:
            return Saved()
        saved = await read_saved(self.settings.kafka_bootstrap, self.topics.tokens, req.generation_id, started - 5_000)
        saved.chunks = {seq: await self._open(chunk) for seq, chunk in saved.chunks.items()}
        return saved

    async def _open(self, event: Any) -> Any:
        return await self.sealer.open(event) if self.sealer else event

    async def seal(self, event: Any) -> Any:
        return await self.sealer.seal(event) if self.sealer and event.generation_id in self.sealing else event

    async def _deleted(self, req: GenerationRequested) -> None:
        await self.engine.abort(req.generation_id)
        await self.finisher.deleted(req)


async def _wait_any(*events: asyncio.Event, timeout: float) -> None:
    waiters = [asyncio.create_task(e.wait()) for e in events]
    try:
        await asyncio.wait(waiters, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for w in waiters:
            w.cancel()
