"""The simulated engine: a GPU replica at the seeds' rates behind the worker's ``Engine`` interface.

A product feature for load tests and capacity planning, chosen per pool (``engine = "sim"`` in pools.toml),
beside vLLM, never instead of it: every feature still runs against the real engine in the tests. It lets
the whole pipeline (gateway, stages, worker, Kafka, Cassandra) run at GPU rates on CPUs: one replica makes
~5,000 tokens a second for 183 streams, as the seeds' does.

``SimCore`` (sim_core.py) decides and prices each step in virtual time; this module is its transport: one
asyncio task runs a step, sleeps its duration on an absolute schedule, then hands each sequence its token
(or, with the request's ``stream_interval``, its tokens every that many, as vLLM does).
Replies are deterministic (the request's seed, else its prompt) and made of real token ids of the pool's
tokenizer, so counts and text match what a model of that vocabulary would produce; their length is about
``reply_tokens``, capped by ``max_tokens``. Its own CPU is measured apart (``sim_stats``): the thread time
spent deciding steps and handing out tokens, so a load test can subtract it from the worker's.

What it does not imitate: the content of replies (a fixed English passage, or ``{"text": ...}`` when a JSON
response format is asked, not checked against a schema), sampling parameters other than ``seed``,
``min_tokens`` and ``ignore_eos`` (stop strings never match), and vLLM's preemption of running requests by
higher-priority arrivals (priority orders the waiting queue only).
"""
from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import random
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from consumers.generation.engine import EngineDead, EngineStats, Gate, RequestRejected, StepOutput, render_chat
from consumers.generation.sampling import GREEDY, Sampling
from consumers.generation.sim_core import SimCore, SimSequence
from schemas.sampling import TokenLogprob, TopLogprob

if TYPE_CHECKING:
    from infra.config.pools import PoolConfig

PASSAGE = (
    "The river begins in the hills above the town, where snow melts each spring and feeds a dozen small "
    "streams. By the time it reaches the old stone bridge it is wide and slow, and in summer children swim "
    "near the bank while their parents sit in the shade of the willows. Farther down, the water turns the "
    "wheel of a mill that has ground flour for three hundred years. The miller keeps careful records: how "
    "much grain arrived, how much flour left, and what the weather was on every working day. Those records "
    "show that the river has changed more than anyone remembers. Floods that once came every decade now come "
    "every few years, and dry summers leave the wheel still for weeks. Engineers have proposed a new channel "
    "to carry the spring water around the town, but the plan would cost a great deal and take years to "
    "build. In the meantime, people have learned to read the river as their grandparents did, watching the "
    "colour of the water and the height of the reeds, and moving their boats before the rain arrives. "
)
log = logging.getLogger(__name__)
DEAD = StepOutput(request_id="", token_ids=(), text="", finished=True, finish_reason="error")  # the loop died
LOGPROB = -0.25  # what a confident model gives its sampled token; alternatives get less


class TokenText:
    """The passage as token ids of the pool's tokenizer, and each id's text, decoded once at start."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.ids: list[int] = list(tokenizer.encode(PASSAGE, add_special_tokens=False))
        self.pieces: dict[int, str] = {i: tokenizer.decode([i]) for i in set(self.ids)}

    def text(self, ids: Sequence[int]) -> str:
        pieces = self.pieces
        return "".join(pieces[i] if i in pieces else self._piece(i) for i in ids)

    def _piece(self, token_id: int) -> str:
        self.pieces[token_id] = piece = self.tokenizer.decode([token_id])
        return piece

    def reply(self, rng: random.Random, length: int) -> list[int]:
        ids, start = self.ids, rng.randrange(len(self.ids))
        return [ids[(start + i) % len(ids)] for i in range(length)]


def plan_reply(text: TokenText, mean_tokens: int, prompt: Sequence[int], max_tokens: int,
               sampling: Sampling, seed: int) -> tuple[list[int], str]:
    """The reply a request will get and why it ends: deterministic for the same seed, else the same prompt."""
    rng = random.Random(hash((seed, sampling.seed)) if sampling.seed is not None else hash((seed, *prompt)))
    natural = max(1, round(mean_tokens * rng.uniform(0.5, 1.5)))
    if sampling.ignore_eos:
        natural = max_tokens
    natural = max(natural, sampling.min_tokens)
    if sampling.response_format is not None:
        body = " ".join(text.text(text.reply(rng, max(4, min(natural, max_tokens) - 8))).split())
        ids = list(text.tokenizer.encode(json.dumps({"text": body}), add_special_tokens=False))
    else:
        ids = text.reply(rng, natural)
    if len(ids) >= max_tokens:
        return ids[:max_tokens], "length"
    return ids, "stop"


def joined(first: StepOutput, then: StepOutput) -> StepOutput:
    """Two outputs of one request as one, as vLLM merges the delta outputs its reader has not taken yet."""
    logprobs = None if first.logprobs is None and then.logprobs is None else [*(first.logprobs or ()),
                                                                                *(then.logprobs or ())]
    return StepOutput(request_id=then.request_id, token_ids=first.token_ids + then.token_ids,
                      text=first.text + then.text, finished=then.finished, finish_reason=then.finish_reason,
                      prompt_tokens=then.prompt_tokens, cached_prompt_tokens=first.cached_prompt_tokens,
                      logprobs=logprobs)


class _Slot:
    """One request's outputs on their way to its reader: those not taken yet are joined into one (as vLLM's
    ``RequestOutputCollector``), and a finish wakes the reader's gate."""

    __slots__ = ("out", "waiter", "gate")

    def __init__(self, gate: Gate | None) -> None:
        self.out: StepOutput | None = None
        self.waiter: asyncio.Future[None] | None = None
        self.gate = gate

    def put(self, out: StepOutput) -> None:
        self.out = out if self.out is None or out is DEAD else joined(self.out, out)
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(None)
        if out.finished and self.gate is not None:
            self.gate.wake()

    async def get(self) -> StepOutput:
        while self.out is None:
            self.waiter = asyncio.get_running_loop().create_future()
            try:
                await self.waiter
            finally:
                self.waiter = None
        out, self.out = self.out, None
        return out


class SimEngine:
    """One pool's simulated replica; same contract as ``VllmEngine``."""

    def __init__(self, pool: PoolConfig, tokenizer: Any) -> None:
        self.pool = pool
        self.model_name = pool.served_model_name
        self.core = SimCore(pool.sim, max_num_seqs=pool.max_num_seqs,
                            max_num_batched_tokens=pool.max_num_batched_tokens,
                            enable_prefix_caching=pool.enable_prefix_caching)
        self._tokenizer = tokenizer
        self._text = TokenText(tokenizer)
        self._queues: dict[str, _Slot] = {}
        self._logprobs: dict[str, int] = {}
        self._intervals: dict[str, int] = {}  # a request's stream interval, where above 1
        self._unsent: dict[str, list[int]] = {}  # its tokens made since the last hand-over
        self._wake: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None
        self._dead: EngineDead | None = None
        self.load_seconds = 0.0
        self.steps = 0
        self.tokens = 0
        self.cpu_seconds = 0.0  # this engine's own thread time: deciding steps, handing out tokens
        self.lag_seconds = 0.0  # how far the steps fell behind their schedule (a busy event loop)

    @classmethod
    def for_pool(cls, pool: PoolConfig) -> SimEngine:
        """The pool's own tokenizer (its model folder), so prompt and reply counts are real."""
        from transformers import AutoTokenizer

        started = time.perf_counter()
        engine = cls(pool, AutoTokenizer.from_pretrained(pool.model_dir))
        engine.load_seconds = time.perf_counter() - started
        return engine

    @property
    def tokenizer(self) -> Any:
        return self._tokenizer

    def apply_chat_template(self, messages: Sequence[Mapping[str, str]]) -> list[int]:
        return render_chat(self._tokenizer, messages)

    async def generate(self, request_id: str, prompt_token_ids: Sequence[int], max_tokens: int,
                       priority: int = 0, sampling: Sampling = GREEDY,
                       gate: Gate | None = None) -> AsyncIterator[StepOutput]:
        if self._dead is not None:
            raise self._dead
        if len(prompt_token_ids) + 1 > self.pool.max_model_len or max_tokens < 1:
            raise RequestRejected(f"prompt of {len(prompt_token_ids)} tokens and {max_tokens} to generate do "
                                  f"not fit the model's context of {self.pool.max_model_len}")
        if request_id in self.core.by_id:
            raise RequestRejected(f"request {request_id} is already running")
        reply, reason = plan_reply(self._text, self.pool.sim.reply_tokens, prompt_token_ids, max_tokens,
                                   sampling, self.pool.sim.seed)
        queue = self._queues[request_id] = _Slot(gate)
        if sampling.logprobs is not None:
            self._logprobs[request_id] = sampling.logprobs
        if sampling.stream_interval > 1:
            self._intervals[request_id] = sampling.stream_interval
        self.core.add(request_id, prompt_token_ids, reply, reason, priority)
        self._kick()
        finished = False
        try:
            while not finished:
                out = await queue.get()
                if out is DEAD:
                    raise self._dead or EngineDead(f"the {self.pool.name} simulated engine stopped")
                finished = out.finished
                yield out
                if gate is not None and not finished:
                    await gate.wait()
        finally:
            self._queues.pop(request_id, None)
            self._logprobs.pop(request_id, None)
            self._intervals.pop(request_id, None)
            self._unsent.pop(request_id, None)
            if not finished:  # the caller walked away: free the sequence at the next step
                self.core.abort(request_id)
                self._kick()

    async def abort(self, request_id: str) -> None:
        self.core.abort(request_id)
        self._kick()

    def stats(self) -> EngineStats:
        core = self.core
        return EngineStats(running=len(core.running), waiting=len(core.waiting) + len(core.handing_over),
                           kv_cache_usage=core.kv_usage, prefix_cache_hit_rate=core.prefix_hit_rate)

    def held_prefixes(self) -> list[int]:
        """The chain hashes of recent prompt prefixes still in this replica's cache (``SimCore.held_prefixes``),
        announced so cache-aware routing can send a prompt where its start is already computed."""
        return self.core.held_prefixes()

    def sim_stats(self) -> dict[str, float]:
        """The simulator's own accounts, apart from the worker's: steps, tokens, its CPU, its lag."""
        return {"steps": self.steps, "tokens": self.tokens, "cpu_seconds": self.cpu_seconds,
                "lag_seconds": self.lag_seconds, "virtual_seconds": self.core.now,
                "preemptions": self.core.preemptions}

    async def close(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    # -- the step loop -------------------------------------------------------------------------------------
    def _kick(self) -> None:
        if self._wake is None:
            self._wake = asyncio.Event()
        self._wake.set()
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run(), name=f"sim-engine-{self.pool.name}")

    async def _run(self) -> None:
        try:
            await self._steps()
        except Exception as exc:  # noqa: BLE001 - a fault of the simulator ends every sequence, loudly
            log.exception("simulated engine of pool %s stopped", self.pool.name)
            self._dead = EngineDead(f"the {self.pool.name} simulated engine stopped: {type(exc).__name__}: {exc}")
            for queue in self._queues.values():
                queue.put(DEAD)

    async def _steps(self) -> None:
        assert self._wake is not None
        deadline = time.monotonic()
        while True:
            if self.core.idle:
                self._wake.clear()
                await self._wake.wait()
                deadline = time.monotonic()
            cpu = time.thread_time()
            result = self.core.step()
            self.cpu_seconds += time.thread_time() - cpu
            if not result.outputs and result.duration_s == 0:
                await self._idle_until_handover()
                deadline = time.monotonic()
                continue
            # 1. the step takes its modelled time, on an absolute schedule so small delays do not add up
            deadline += result.duration_s
            delay = deadline - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            else:
                self.lag_seconds -= delay
                deadline = time.monotonic()
            # 2. then each sequence gets what the step made
            cpu = time.thread_time()
            self.steps += 1
            for out in result.outputs:
                self._deliver(out.seq, out.token_ids, out.finish_reason)
            self.cpu_seconds += time.thread_time() - cpu

    async def _idle_until_handover(self) -> None:
        """Nothing to run: either idle, or disaggregated hand-overs are still on the wire."""
        assert self._wake is not None
        landing = self.core.next_event_s()
        wait = 0.05 if landing is None else max(0.0, landing - self.core.now)  # None: waiting for room
        self._wake.clear()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._wake.wait(), timeout=wait)
        if landing is not None:
            self.core.advance_idle(wait)

    def _deliver(self, seq: SimSequence, token_ids: tuple[int, ...], reason: str | None) -> None:
        queue = self._queues.get(seq.request_id)
        if queue is None:
            return
        self.tokens += len(token_ids)
        interval = self._intervals.get(seq.request_id)
        if interval is not None:  # as vLLM's: the first at once, then every interval, the last at once
            unsent = self._unsent.get(seq.request_id)
            if unsent is None:
                self._unsent[seq.request_id] = []
            else:
                unsent.extend(token_ids)
                if reason is None and len(unsent) < interval:
                    return
                token_ids, self._unsent[seq.request_id] = tuple(unsent), []
        k = self._logprobs.get(seq.request_id)
        queue.put(StepOutput(
            request_id=seq.request_id, token_ids=token_ids, text=self._text.text(token_ids),
            finished=reason is not None, finish_reason=reason, prompt_tokens=len(seq.prompt),
            cached_prompt_tokens=max(0, seq.cached_prompt_tokens),
            logprobs=None if k is None else [self._logprob(t, k) for t in token_ids]))

    def _logprob(self, token_id: int, k: int) -> TokenLogprob:
        piece = self._text.text((token_id,))
        others = [i for i in self._text.ids[:k + 1] if i != token_id][:max(0, k - 1)]
        top = [TopLogprob(piece, LOGPROB)] + [TopLogprob(self._text.text((i,)), LOGPROB - 1.5 - n)
                                              for n, i in enumerate(others)]
        return TokenLogprob(token=piece, logprob=LOGPROB, top=top[:k])
