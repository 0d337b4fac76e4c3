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
import contextlib
import logging
import os
import socket
import time
from dataclasses import dataclass
from typing import Any

import redis.asyncio as aioredis
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.errors import KafkaError

from consumers.generation import assignor
from consumers.generation.announce import Announcer
from consumers.generation.appending import Appender
from consumers.generation.cancels import Cancels
from consumers.generation.coalescing import FlushPolicy
from consumers.generation.decisions import (
    STALE_REQUEST_S,
    Finish,
    Generate,
    Limits,
    decide,
    finished_event,
    is_stale,
    status_for,
)
from consumers.generation.engine import EngineDead
from consumers.generation.fencing import Fence
from consumers.generation.finishing import Finisher
from consumers.generation.intake import Intake, request_key
from consumers.generation.metrics import WorkerMetrics
from consumers.generation.rebalance import Rebalance
from consumers.generation.recovery import Saved, read_saved
from consumers.generation.reply_stream import ReplyStream
from consumers.generation.sampling import for_request
from consumers.safety.classifier import Verdict
from consumers.safety.metrics import SafetyMetrics
from consumers.safety.output import OutputCheck, OutputGuard
from infra.config.plans import Plan, load_plans
from infra.config.settings import Settings
from infra.stores.crypto import KeyGone
from infra.stores.finished import FinishedReplies
from infra.stores.quota import Quota
from infra.stores.retry import FIRST_DELAY_S, MAX_DELAY_S, STORE_DOWN, dependency_of
from infra.stores.sealing import Sealer, is_sealed
from schemas import (
    GenerationRequested,
    GenerationStarted,
    TokensAppended,
    keyless,
)
from schemas.generation import Status
from topics import GENERATE, Role, Topics
from topics.catalogue import CONTROL, DEADLETTER, GENERATION, REPLIES, TOKENS
from topics.clients import decode_or_deadletter, enqueue, make_consumer

log = logging.getLogger(__name__)
# Reads chat.control (broadcast) and its own earlier tokens on chat.tokens (recovery), without a group.
ROLE = Role(GENERATION, reads=(GENERATE, CONTROL, TOKENS), writes=(TOKENS, REPLIES, DEADLETTER))
# Outages a request waits out in place (Kafka's are the producer's timeouts and a recovery read's).
RETRYABLE: tuple[type[BaseException], ...] = (*STORE_DOWN, KafkaError)
# A dead worker's hand-over: the group coordinator evicts a member that sent no heartbeat for SESSION_TIMEOUT_MS
# (6 s, the broker's default floor, group.min.session.timeout.ms) and the rebalance gives its partitions to the
# pool's other replicas, which resume its replies from their saved tokens; the longest stall is this, the
# rebalance and one prefill. Lower would evict a worker whose loop a loaded machine starves for a few seconds.
SESSION_TIMEOUT_MS, HEARTBEAT_MS = 6_000, 1_000


@dataclass(frozen=True)
class Ran:
    """How the engine loop ended: the engine's finish reason, or the output check's flag that stopped it."""

    finish_reason: str | None
    blocked: Verdict | None


@dataclass(frozen=True)
class Ended:
    """How the engine loop left a reply: its status and why, and the output check's flag if it stopped it."""

    status: Status
    reason: str
    blocked: Verdict | None


class GenerationWorker:
    def __init__(self, settings: Settings, limits: Limits, engine: Any, capacity: int,
                 worker_id: str | None = None, metrics_port: int | None = None,
                 on_ready: Any = None, classifier: Any = None, metrics_host: str = "127.0.0.1",
                 sealer: Sealer | None = None, plans: dict[str, Plan] | None = None,
                 flush: FlushPolicy = FlushPolicy(), stand_in_from: str = "") -> None:
        """``stand_in_from``: the pool whose engine this worker runs when it stands in for ``limits.pool``
        (consumers/generation/standin.py); "" for one of the pool's own replicas."""
        self.on_ready, self.sealer, self.flush, self.stand_in_from = on_ready, sealer, flush, stand_in_from
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
                                 FinishedReplies(self.redis), self.metrics, self._seal)

    @property
    def producer(self) -> Any:
        """The appender's current producer (renewed after a Kafka outage)."""
        return self.appender.producer

    @producer.setter
    def producer(self, producer: Any) -> None:
        self.appender.producer = producer

    async def _landed(self, generation_id: str, futures: list[asyncio.Future[Any]]) -> None:
        await self.appender.landed(generation_id, futures)

    # -- lifecycle ---------------------------------------------------------------------------------------
    async def run(self) -> None:
        await self.producer.start()
        self.consumer.subscribe([self.paid, self.free], listener=Rebalance(self))
        await self.consumer.start()
        if self.metrics_port is not None:
            self.metrics_port = self.metrics.serve(self.metrics_port, self.metrics_host)
        control = asyncio.create_task(self.cancels.follow(self.settings.kafka_bootstrap, self.topics.control),
                                      name="control")
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
        await self._stream(req, decision, saved, picked_at)

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

    async def _seal(self, event: Any) -> Any:
        return await self.sealer.seal(event) if self.sealer and event.generation_id in self.sealing else event

    async def _deleted(self, req: GenerationRequested) -> None:
        await self.engine.abort(req.generation_id)
        await self.finisher.deleted(req)

    async def _stream(self, req: GenerationRequested, gen: Generate, saved: Saved, picked_at: float) -> None:
        """Run the reply on the engine and write its records; the reply's state (what was gathered, numbered,
        shown) is ``ReplyStream``'s, this loop does the I/O around it."""
        state = ReplyStream(req.generation_id, req.conversation_id, len(req.prompt_token_ids), gen, saved,
                            self.flush)
        guard = self.safety.start(req.plan, req.purpose) if self.safety is not None else None
        pending: list[asyncio.Future[Any]] = []  # handed to the producer, not acknowledged yet
        blocked, gone = None, False  # the flagged verdict; the conversation was deleted
        try:
            ran = await self._run(req, gen, saved, state, guard, pending, picked_at)
            if ran is None:
                return  # fenced off: the newer owner finishes it
            blocked = ran.blocked
            status, reason = status_for(ran.finish_reason, req.generation_id in self.cancels), ""
        except asyncio.CancelledError:
            raise
        except RETRYABLE:  # a store, not the engine: stop here; the request is served again once it is back
            await self.engine.abort(req.generation_id)
            with contextlib.suppress(*RETRYABLE):  # not acknowledged yet: kept for the retry to settle
                await self._landed(req.generation_id, pending)
            raise
        except KeyGone:  # deleted while generating, before its cancel arrived: nothing more may be sealed
            await self.engine.abort(req.generation_id)
            status, reason, gone = "stopped", "conversation deleted", True
            state.emptied()
        except EngineDead:  # not this reply's fault: it is left unfinished for a live engine to resume
            with contextlib.suppress(*RETRYABLE):
                await self._landed(req.generation_id, pending)
            raise
        except Exception as exc:  # noqa: BLE001 - engine errors end this reply, not the worker
            log.exception("generation %s failed in the engine", req.generation_id)
            status, reason = "failed", f"the model failed while generating: {type(exc).__name__}"
        if state.gathered and blocked is None and not gone:  # the engine stopped without a last output
            await self._flush(req, state, time.time(), guard, pending)
        await self._landed(req.generation_id, pending)
        await self._ended(req, state, guard, Ended(status, reason, blocked), picked_at)

    async def _run(self, req: GenerationRequested, gen: Generate, saved: Saved, state: ReplyStream,
                   guard: OutputGuard | None, pending: list[asyncio.Future[Any]], picked_at: float) -> Ran | None:
        """The engine loop: each output counted, recorded when due, checked when its chunk is complete. None when
        this worker found itself fenced off (paused past its lease: SIGSTOP, a long GC)."""
        sampling = for_request(req, saved_tokens=len(saved.token_ids), max_tokens=gen.max_tokens)
        lane_tokens = self.metrics.lane_tokens.labels(pool=self.limits.pool, lane=req.lane)  # once, not per output
        async for out in self.engine.generate(req.generation_id, gen.prompt_token_ids, gen.max_tokens,
                                              gen.priority, sampling):
            now = time.time()
            if req.generation_id in self.cancels:
                await self.engine.abort(req.generation_id)  # the cancel raced the engine's admission
            took = state.took(out, now)
            if took.first:
                self.metrics.ttft.observe(now - picked_at)
                self.metrics.prompt_seen(state.prompt_tokens, state.cached)
            if took.announce:
                pending.append(await self._started(req, state.first_token_at, state.cached, gen.resumed))
            if took.check_fence and await self.fence.fenced(req.generation_id):
                await self.engine.abort(req.generation_id)
                await asyncio.gather(*pending)
                return None
            check = guard is not None and guard.add(out.text, took.tokens, out.finished)
            if took.tokens:
                self.metrics.tokens.inc(took.tokens)
                lane_tokens.inc(took.tokens)
            # What the safety check reads is in records before it decides (held back or already shown, as
            # the plan says); a finish or a cancel goes out at once.
            if state.due(now, urgent=out.finished or check or req.generation_id in self.cancels):
                await self._flush(req, state, now, guard, pending)
            if took.gap_s is not None:
                self.metrics.itl.observe(took.gap_s)
            if check and guard is not None:
                blocked = await self._checked(req, guard)
                if blocked is not None:
                    return Ran(None, blocked)
                for held in guard.passed():
                    pending.append(await self._append(held))
                    state.sent(held.seq)
            if out.finished:
                return Ran(out.finish_reason, None)
        return Ran(None, None)

    async def _ended(self, req: GenerationRequested, state: ReplyStream, guard: OutputGuard | None, end: Ended,
                     picked_at: float) -> None:
        """The reply's records have landed: drop what the output check held and never passed, or retract the
        reply it flagged, then write the finish."""
        status, reason, block = end.status, end.reason, None
        if guard is not None and guard.held and end.blocked is None:  # the engine failed mid-chunk
            state.unshown("".join(h.text for h in guard.held))
        if status == "stopped" and end.blocked is None:
            self.metrics.aborts.inc()
        if end.blocked is not None and self.safety is not None:
            notice = await self.safety.retract(self.producer, self.redis, self.topics.tokens, req, end.blocked,
                                               state.shown)
            status, block = "blocked", end.blocked.block("output")
            state.retracted(notice)
            reason = f"output check: {block.category} ({block.score:.2f}), rules {block.rules_version}"
        await self.finisher.finish(finished_event(req, self.limits, self.worker_id, status, state.reply, state.usage(),
                                          state.last_seq, reason, picked_at, state.first_token_at, block))

    async def _flush(self, req: GenerationRequested, state: ReplyStream, now: float, guard: OutputGuard | None,
                     pending: list[asyncio.Future[Any]]) -> None:
        """One record of what was gathered, handed to the producer, or held back while the safety check
        has not passed its chunk."""
        step = state.record(now, self.fence.epoch(req.generation_id))
        if guard is not None and guard.holds:
            guard.hold(step)  # shown once its chunk has passed the check
            return
        pending.append(await self._append(step))
        state.sent(step.seq)

    async def _append(self, step: TokensAppended) -> asyncio.Future[Any]:
        """Checked (when held back) in clear here; sealed on the way out. The value leaves out the generation id:
        the record key is it."""
        gid = step.generation_id
        return await self.producer.send(self.topics.tokens, keyless(await self._seal(step)), key=gid.encode(),
                                        partition=self.appender.partition(self.topics.tokens, gid))

    async def _checked(self, req: GenerationRequested, guard: OutputGuard) -> Verdict | None:
        """Classify the chunk just completed; a flagged one aborts the sequence before the next step."""
        if self.safety is None:
            return None  # no output check: no guard was made, nothing to classify
        verdict = await self.safety.check(guard, req)
        if verdict.flagged:
            await self.engine.abort(req.generation_id)
        return verdict if verdict.flagged else None

    async def _started(self, req: GenerationRequested, first_token_at: float, cached: int,
                       resumed: bool) -> asyncio.Future[Any]:
        """Hand the generation's ``GenerationStarted`` to the producer; the first token goes out behind it without
        waiting for its ack. (The started marker recovery reads was set when the generation was taken on.)"""
        return await enqueue(self.producer, self.topics.tokens, GenerationStarted(
            generation_id=req.generation_id, conversation_id=req.conversation_id, user_id=req.user_id,
            message_id=req.message_id, model=self.limits.model, pool=self.limits.pool, worker_id=self.worker_id,
            first_token_at=first_token_at, prompt_tokens=len(req.prompt_token_ids), cached_prompt_tokens=cached,
            resumed=resumed, epoch=self.fence.epoch(req.generation_id)), key=req.generation_id)


async def _wait_any(*events: asyncio.Event, timeout: float) -> None:
    waiters = [asyncio.create_task(e.wait()) for e in events]
    try:
        await asyncio.wait(waiters, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for w in waiters:
            w.cancel()
