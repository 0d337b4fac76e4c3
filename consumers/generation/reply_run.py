"""One reply run on the engine, with the I/O around it: the engine loop, its records, the output check, the finish.

``ReplyStream`` holds the reply's state with no I/O (tokens in, numbered records out); a ``ReplyRun`` feeds it the
engine's outputs and does what each asks: the start record behind the first token, a record when one is due
(held back while the output check has not passed its chunk), the fence check after a long gap, the check of a
completed chunk (a flagged one aborts the sequence and retracts what was shown), and the finish once every
record has landed. It borrows the rest from the worker that runs it (``Crew``).
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass
from typing import Any, Protocol

import msgspec
from aiokafka.errors import KafkaError

from consumers.generation.appending import Appender
from consumers.generation.cancels import Cancels
from consumers.generation.coalescing import FlushPolicy, Pace
from consumers.generation.decisions import Generate, Limits, finished_event, status_for
from consumers.generation.engine import EngineDead
from consumers.generation.fencing import Fence
from consumers.generation.finishing import Finisher
from consumers.generation.flush_clock import FlushClock, Gate
from consumers.generation.metrics import WorkerMetrics
from consumers.generation.recovery import Saved
from consumers.generation.reply_stream import ReplyStream
from consumers.generation.sampling import for_request
from consumers.safety.classifier import Verdict
from consumers.safety.output import OutputCheck, OutputGuard
from infra.stores.crypto import KeyGone
from infra.stores.retry import STORE_DOWN
from schemas import GenerationRequested, GenerationStarted, TokensAppended, keyless
from schemas.generation import Status
from topics import Topics
from topics.clients import enqueue

log = logging.getLogger(__name__)

# Outages a request waits out in place (Kafka's are the producer's timeouts and a recovery read's).
RETRYABLE: tuple[type[BaseException], ...] = (*STORE_DOWN, KafkaError)


class Crew(Protocol):
    """What a reply's run borrows from the worker that runs it."""

    engine: Any
    limits: Limits
    worker_id: str
    topics: Topics
    appender: Appender
    fence: Fence
    cancels: Cancels
    metrics: WorkerMetrics
    safety: OutputCheck | None
    finisher: Finisher
    redis: Any
    flush: FlushPolicy
    clock: FlushClock
    pace: Pace

    async def seal(self, event: Any) -> Any: ...


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


class ReplyRun:
    def __init__(self, crew: Crew, req: GenerationRequested, gen: Generate, saved: Saved, picked_at: float) -> None:
        self.crew, self.req, self.gen, self.saved, self.picked_at = crew, req, gen, saved, picked_at
        self.state = ReplyStream(req.generation_id, req.conversation_id, len(req.prompt_token_ids), gen, saved,
                                 crew.flush)
        self.guard: OutputGuard | None = (crew.safety.start(req.plan, req.purpose) if crew.safety is not None
                                          else None)
        self.held = self.guard is not None and self.guard.holds  # its text waits for the check, a chunk at a time
        self.pending: list[asyncio.Future[Any]] = []  # handed to the producer, not acknowledged yet
        self._order = asyncio.Lock()  # the loop's flushes and the clock's: records handed over in seq order
        self._late: BaseException | None = None  # the clock's flush failed: raised in the loop at its next output
        self._on_clock = False  # the engine loop runs and the clock flushes it
        self.gate: Gate | None = None  # where the loop waits between outputs when the clock drains

    @property
    def gid(self) -> str:
        return self.req.generation_id

    async def stream(self) -> None:
        """Run the reply on the engine and write its records, then its finish. A store outage or a dead engine
        is raised with what was written still acknowledged (the retry, or the next owner, goes on from it)."""
        crew = self.crew
        blocked, gone = None, False  # the flagged verdict; the conversation was deleted
        try:
            ran = await self._run()
            if ran is None:
                return  # fenced off: the newer owner finishes it
            blocked = ran.blocked
            status, reason = status_for(ran.finish_reason, self.gid in crew.cancels), ""
        except asyncio.CancelledError:
            raise
        except RETRYABLE:  # a store, not the engine: stop here; the request is served again once it is back
            await crew.engine.abort(self.gid)
            with contextlib.suppress(*RETRYABLE):  # not acknowledged yet: kept for the retry to settle
                await crew.appender.landed(self.gid, self.pending)
            raise
        except KeyGone:  # deleted while generating, before its cancel arrived: nothing more may be sealed
            await crew.engine.abort(self.gid)
            status, reason, gone = "stopped", "conversation deleted", True
            self.state.emptied()
        except EngineDead:  # not this reply's fault: it is left unfinished for a live engine to resume
            with contextlib.suppress(*RETRYABLE):
                await crew.appender.landed(self.gid, self.pending)
            raise
        except Exception as exc:  # noqa: BLE001 - engine errors end this reply, not the worker
            log.exception("generation %s failed in the engine", self.gid)
            status, reason = "failed", f"the model failed while generating: {type(exc).__name__}"
        if self.state.gathered and blocked is None and not gone:  # the engine stopped without a last output
            await self._flush(time.time())
        await crew.appender.landed(self.gid, self.pending)
        await self._ended(Ended(status, reason, blocked))

    async def _run(self) -> Ran | None:
        """The engine loop: each output counted, recorded when due, checked when its chunk is complete. None when
        this worker found itself fenced off (paused past its lease: SIGSTOP, a long GC)."""
        crew, req, gen = self.crew, self.req, self.gen
        sampling = msgspec.structs.replace(for_request(req, saved_tokens=len(self.saved.token_ids),
                                                       max_tokens=gen.max_tokens),
                                           stream_interval=crew.pace.interval(crew.flush))
        lane_tokens = crew.metrics.lane_tokens.labels(pool=crew.limits.pool, lane=req.lane)  # once, not per output
        if crew.clock.drains:  # every reply's loop wakes at its group's tick and makes its record then (held-back
            crew.clock.follow(self)  # text is checked then); the clock only opens the gate
            self.gate = crew.clock.gate(self)
        elif not self.held:  # held-back text waits for its check, not for the clock
            crew.clock.follow(self)
            self._on_clock = True
        try:
            return await self._outputs(sampling, lane_tokens)
        finally:  # ended, fenced off, or let go (a rebalance): the clock writes nothing more for it
            self._on_clock = False
            self.gate = None
            crew.clock.drop(self)

    async def _outputs(self, sampling: Any, lane_tokens: Any) -> Ran | None:
        crew, req, gen, state, guard = self.crew, self.req, self.gen, self.state, self.guard
        async for out in crew.engine.generate(req.generation_id, gen.prompt_token_ids, gen.max_tokens,
                                              gen.priority, sampling, gate=self.gate):
            if self._late is not None:
                raise self._late
            now = time.time()
            if req.generation_id in crew.cancels:
                await crew.engine.abort(req.generation_id)  # the cancel raced the engine's admission
            took = state.took(out, now)
            if took.first:
                crew.metrics.ttft.observe(now - self.picked_at)
                crew.metrics.prompt_seen(state.prompt_tokens, state.cached)
            if took.announce:
                self.pending.append(await self._started())
            if took.check_fence and await crew.fence.fenced(req.generation_id):
                await crew.engine.abort(req.generation_id)
                await asyncio.gather(*self.pending)
                return None
            check = guard is not None and guard.add(out.text, took.tokens, out.finished)
            if took.tokens:
                crew.metrics.tokens.inc(took.tokens)
                lane_tokens.inc(took.tokens)
            if check and guard is not None and not self.held:
                # Text shown at once (hold-back 0) is checked a chunk at a time, before the hand-over that completes
                # the chunk may be shown (by this loop or the clock): a flagged chunk's last hand-over, and what came
                # with it past the chunk, is never shown. One that passes keeps its window.
                async with self._order:
                    blocked = await self._checked(guard)
                if blocked is not None:
                    return Ran(None, blocked)
                guard.passed()
                check = False
            # A finish or a cancel goes out at once. Text held until its chunk passes is a record a chunk (a
            # record a window would be shown no sooner), made before the check decides, so that passing it
            # shows it.
            if state.due(now, urgent=out.finished or (check and self.held) or req.generation_id in crew.cancels
                         or self._ticked(), window=self._by_window(), held=self.held):
                await self._flush(now)
            if took.gap_s is not None and took.tokens:  # a hand-over of several tokens: the gap per token
                crew.metrics.itl.observe(took.gap_s / took.tokens)
                crew.pace.took(took.gap_s, took.tokens)
            if check and guard is not None:
                blocked = await self._checked(guard)
                if blocked is not None:
                    return Ran(None, blocked)
                for held in guard.passed():
                    self.pending.append(await self._append(held))
                    state.sent(held.seq)
            if out.finished:
                return Ran(out.finish_reason, None)
        if self._late is not None:
            raise self._late
        return Ran(None, None)

    async def _ended(self, end: Ended) -> None:
        """The reply's records have landed: drop what the output check held and never passed, or retract the
        reply it flagged, then write the finish."""
        crew, req, state, guard = self.crew, self.req, self.state, self.guard
        status, reason, block = end.status, end.reason, None
        if guard is not None and guard.held and end.blocked is None:  # the engine failed mid-chunk
            state.unshown("".join(h.text for h in guard.held))
        if status == "stopped" and end.blocked is None:
            crew.metrics.aborts.inc()
        if end.blocked is not None and crew.safety is not None:
            notice = await crew.safety.retract(crew.appender.producer, crew.redis, crew.topics.tokens, req,
                                               end.blocked, state.shown)
            status, block = "blocked", end.blocked.block("output")
            state.retracted(notice)
            reason = f"output check: {block.category} ({block.score:.2f}), rules {block.rules_version}"
        await crew.finisher.finish(finished_event(req, crew.limits, crew.worker_id, status, state.reply,
                                                  state.usage(), state.last_seq, reason, self.picked_at,
                                                  state.first_token_at, block))

    def _ticked(self) -> bool:
        """Drained at the tick: every output after the first is taken at a tick of the reply's group (or is the
        finish), so what it brings is this window's record, made at once. (Left for the clock's next tick, each
        record went out a window after its tokens were taken.)"""
        return self.gate is not None and not self.held

    def _by_window(self) -> bool:
        """Whether the loop flushes this reply once its window has passed. Not while the clock flushes every
        reply together and took this one at its last tick: the next tick will. A reply that had nothing at the
        last tick (a step longer than the window) is flushed at its next output, so a long step costs its gap
        the step, not the step and a window."""
        clock = self.crew.clock
        if not (self._on_clock and clock.together):
            return True
        last = self.state.batch.last_flush
        return last is None or clock.last_tick_of(self) > last

    async def flush_on_time(self, now: float, ahead_s: float) -> None:
        """The worker's clock: a record of what was gathered once the window has passed (or will have, by
        ``ahead_s``), while the engine is still on its step. A failure is raised in the engine loop, where every
        outage is handled."""
        if (not self._on_clock or self._late is not None
                or self.state.seq == self.gen.first_seq  # the first record is the loop's, behind GenerationStarted
                or not self.state.due(now + ahead_s, urgent=False)):
            return
        try:
            await self._flush(now, clocked=True)
        except Exception as exc:  # noqa: BLE001 - handed to the loop
            self._late = exc

    async def _flush(self, now: float, clocked: bool = False) -> None:
        """One record of what was gathered, handed to the producer, or held back while the safety check
        has not passed its chunk."""
        async with self._order:
            if not self.state.gathered or (clocked and not self._on_clock):
                return  # the other flush took it while this waited, or the loop ended meanwhile
            step = self.state.record(now, self.crew.fence.epoch(self.gid))
            if self.held and self.guard is not None:
                self.guard.hold(step)  # shown once its chunk has passed the check
                return
            self.pending.append(await self._append(step))
            self.state.sent(step.seq)

    async def _append(self, step: TokensAppended) -> asyncio.Future[Any]:
        """Checked (when held back) in clear here; sealed on the way out. The value leaves out the generation id:
        the record key is it."""
        crew, gid = self.crew, step.generation_id
        return await crew.appender.producer.send(crew.topics.tokens, keyless(await crew.seal(step)),
                                                 key=gid.encode(), partition=crew.appender.partition(
                                                     crew.topics.tokens, gid))

    async def _checked(self, guard: OutputGuard) -> Verdict | None:
        """Classify the chunk just completed; a flagged one aborts the sequence before the next step."""
        if self.crew.safety is None:
            return None  # no output check: no guard was made, nothing to classify
        verdict = await self.crew.safety.check(guard, self.req)
        if verdict.flagged:
            await self.crew.engine.abort(self.gid)
        return verdict if verdict.flagged else None

    async def _started(self) -> asyncio.Future[Any]:
        """Hand the generation's ``GenerationStarted`` to the producer; the first token goes out behind it without
        waiting for its ack. (The started marker recovery reads was set when the generation was taken on.)"""
        crew, req, state = self.crew, self.req, self.state
        return await enqueue(crew.appender.producer, crew.topics.tokens, GenerationStarted(
            generation_id=req.generation_id, conversation_id=req.conversation_id, user_id=req.user_id,
            message_id=req.message_id, model=crew.limits.model, pool=crew.limits.pool, worker_id=crew.worker_id,
            first_token_at=state.first_token_at, prompt_tokens=len(req.prompt_token_ids),
            cached_prompt_tokens=state.cached, resumed=self.gen.resumed, epoch=crew.fence.epoch(req.generation_id)),
            key=req.generation_id)
