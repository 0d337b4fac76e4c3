"""One request as the client saw it, and the figures that follow from it (pure).

Times are ``time.time()`` seconds, taken the moment each chunk arrived, so they compare with the events'
own timestamps (``hops``). One SSE ``delta`` is one token record (the worker coalesces a flush window's
tokens into one), so an inter-token gap (ITL) here is the gap between records as the reader sees them, and
TPOT spreads the stream's duration over its tokens.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any


@dataclass
class RequestRecord:
    index: int
    plan: str
    turn: int
    sent: float  # offset of the POST from the run's start is ``sent - run start``
    status: int = 0  # HTTP status; 0 when no answer came (connection error, timeout)
    generation_id: str = ""
    model: str = ""
    pool: str = ""
    queued_position: int | None = None
    shown_wait_s: float | None = None  # the `queued` event's estimate
    queued_at: float | None = None  # when the `queued` event arrived
    deltas: list[float] = field(default_factory=list)  # arrival time of every delta event
    done: float = 0.0
    stop_reason: str = ""
    tokens_in: int = 0
    tokens_out: int = 0
    chars: int = 0
    error: str = ""  # an error event's code, or the HTTP error's, or the exception's class
    retry_after_s: float | None = None

    @property
    def ok(self) -> bool:
        return self.status == 200 and not self.error and bool(self.stop_reason)

    @property
    def ttft(self) -> float | None:
        return self.deltas[0] - self.sent if self.deltas else None

    def gaps(self) -> list[float]:
        """Every inter-token gap: between consecutive delta events."""
        return [b - a for a, b in itertools.pairwise(self.deltas)]

    @property
    def tpot(self) -> float | None:
        """Time per output token after the first: the stream's length over its tokens less one."""
        if len(self.deltas) < 2 or self.tokens_out < 2:
            return None
        return (self.deltas[-1] - self.deltas[0]) / (self.tokens_out - 1)

    @property
    def real_wait_s(self) -> float | None:
        """How long a queued request really waited: the `queued` event to its first token."""
        if self.queued_at is None or not self.deltas:
            return None
        return self.deltas[0] - self.queued_at

    def to_json(self) -> dict[str, Any]:
        out = {k: v for k, v in vars(self).items() if k != "deltas"}
        out.update(events=len(self.deltas), ttft=self.ttft, tpot=self.tpot, real_wait_s=self.real_wait_s)
        return out
