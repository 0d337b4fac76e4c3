"""One generation's tokens gathered into records: one ``TokensAppended`` per flush window, not per engine step.

At the seeds' step (36 ms) a record per step is 5,000 Kafka records a second per replica, each sealed, sent
and read by every reader of ``chat.tokens``. The worker keeps each generation's outputs here and makes one
record of them when the window has passed since the last record or enough tokens are waiting, whichever
first. The first output, the finish, a cancel and a safety check that needs the chunk's records flush at
once, so time to first token and stop-within-one-step do not change. Pure: no clock of its own, no I/O.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from consumers.generation.engine import StepOutput
from schemas.sampling import TokenLogprob


@dataclass(frozen=True)
class FlushPolicy:
    window_s: float = 0.1  # at the seeds' 36 ms step: 3 tokens a record
    max_tokens: int = 16
    on_time: bool = True  # flushed by the worker's clock too (flush_clock.py), not only when an output arrives
    together: bool = True  # the clock flushes replies in groups, each a window apart (else each on its own window)
    # The engine hands a reply's tokens over every this many (the first and the last at once; vLLM's
    # stream_interval); 0: as many steps as fit in half a window at the engine's recent pace (``Pace``).
    stream_interval: int = 1
    # With groups: each reply's loop takes its engine outputs (joined by the engine) at its group's tick, or at a
    # finish, not at every engine step (flush_clock.py).
    drain_at_tick: bool = True
    # With groups: how many, one flushed a tick (a tick every window / flush_groups). Each tick costs a Kafka
    # produce request and a fetch for every reader, most of it in the clients' Python protocol code.
    flush_groups: int = 2

    @property
    def per_step(self) -> bool:
        return self.window_s <= 0 or self.max_tokens <= 1

    @property
    def tick_s(self) -> float:
        """How often the worker's clock flushes: a group of replies a tick, each group a window apart, when they
        leave together; else a tenth of the window (10 ms at most) to catch each reply's own; 0: no clock."""
        if self.per_step or not self.on_time:
            return 0.0
        return self.window_s / self.groups if self.together else min(self.window_s / 10, 0.01)

    @property
    def groups(self) -> int:
        """Replies flushed together fall into this many groups, one flushed a tick."""
        return max(1, self.flush_groups) if self.together else 1


PACE_SHARE = 0.5  # of a window, what a reply's hand-overs may take: each flush tick still gets at least one
PACE_WEIGHT = 0.05  # of each new gap in the engine's pace (an exponentially weighted mean over ~20 outputs)


@dataclass
class Pace:
    """The engine's recent time per token, from the gaps between a worker's outputs, and the stream interval it
    implies: the worker wakes, counts and checks once per hand-over, so handing over every few tokens saves that
    work per token, while a reply's tokens still reach every flush window (records and their gaps unchanged)."""

    step_s: float | None = None

    def took(self, gap_s: float, tokens: int) -> None:
        if tokens <= 0 or gap_s <= 0:
            return
        per_token = gap_s / tokens
        self.step_s = per_token if self.step_s is None else self.step_s + PACE_WEIGHT * (per_token - self.step_s)

    def interval(self, policy: FlushPolicy) -> int:
        """The stream interval a reply starting now asks of the engine."""
        if policy.stream_interval > 0:
            return policy.stream_interval
        if policy.per_step or not self.step_s:
            return 1
        return max(1, min(policy.max_tokens, int(PACE_SHARE * policy.window_s / self.step_s)))
PER_STEP = FlushPolicy(window_s=0.0, max_tokens=1, on_time=False)  # a record for every engine output


@dataclass
class Batch:
    text: str
    token_ids: list[int]
    logprobs: list[TokenLogprob] | None


@dataclass
class Coalescer:
    policy: FlushPolicy
    _text: list[str] = field(default_factory=list)
    _ids: list[int] = field(default_factory=list)
    _logprobs: list[TokenLogprob] | None = None
    _last_flush: float | None = None  # None: nothing flushed yet, so the first output goes at once

    def add(self, out: StepOutput) -> None:
        self._text.append(out.text)
        self._ids.extend(out.token_ids)
        if out.logprobs is not None:
            self._logprobs = (self._logprobs or []) + list(out.logprobs)

    @property
    def last_flush(self) -> float | None:
        return self._last_flush

    @property
    def empty(self) -> bool:
        return not self._ids and not any(self._text)

    def due(self, now: float, urgent: bool = False, window: bool = True, held: bool = False) -> bool:
        """Whether what is gathered should become a record now; ``window=False``: not for its window's sake (the
        clock flushes it with the others); ``held``: the output check holds the text until its chunk passes, so a
        record made sooner is shown no sooner, and one is made when it is urgent (the chunk complete, a finish,
        a cancel): a record a chunk, not one a window."""
        if self.empty:
            return False
        if held:
            return urgent
        return (urgent or self._last_flush is None or self.policy.per_step
                or len(self._ids) >= self.policy.max_tokens
                or (window and now - self._last_flush >= self.policy.window_s))

    def take(self, now: float) -> Batch:
        batch = Batch("".join(self._text), self._ids, self._logprobs)
        self._text, self._ids, self._logprobs, self._last_flush = [], [], None, now
        return batch
