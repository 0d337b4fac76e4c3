"""The gateway's metrics, served at ``/metrics`` on its HTTP port: what a user sees, by plan and pool.

TTFT is end to end, from the moment the gateway accepted the POST (before it produced ``MessageSubmitted``)
to the moment it handed the first ``delta`` to the client; a reply's tokens/s is its completion tokens over
the time from that first delta to its end. Reconnects are streams resumed with ``Last-Event-ID``. A queued
reply's wait error is its real wait (the ``queued`` event to the first delta) less the wait first shown.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import Counter, Gauge, Histogram

from schemas import GenerationFinished, GenerationQueued, RequestRefused, TokensAppended

# The seed's budget is a first token well under a second; the tail on a busy CPU runs to tens of seconds.
TTFT_BUCKETS = (0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1, 1.5, 2, 3, 5, 10, 20, 60)
RATE_BUCKETS = (1, 2, 5, 10, 15, 20, 30, 40, 60, 100, 200)
# Real wait less the first shown wait: negative when the wait was shorter than shown.
WAIT_ERROR_BUCKETS = (-60, -30, -15, -8, -4, -2, -1, 0, 1, 2, 4, 8, 15, 30, 60)

TTFT = Histogram("parley_gateway_ttft_seconds", "POST accepted to first delta sent, end to end",
                 ["plan", "pool"], buckets=TTFT_BUCKETS)
STREAM_RATE = Histogram("parley_gateway_reply_tokens_per_second", "a reply's completion tokens / first delta to end",
                        ["plan", "pool"], buckets=RATE_BUCKETS)
QUEUED_WAIT_ERROR = Histogram("parley_gateway_queued_wait_error_seconds",
                              "a queued reply's real wait (queued event sent to first delta) less the wait first shown",
                              ["plan", "pool"], buckets=WAIT_ERROR_BUCKETS)
TOKENS = Counter("parley_gateway_completion_tokens", "completion tokens of finished replies", ["plan", "pool"])
REPLY_ENDS = Counter("parley_gateway_replies", "replies that ended, by stop reason", ["plan", "pool", "stop_reason"])
REFUSALS = Counter("parley_gateway_refusals", "requests refused (quota, overload, invalid), by HTTP status",
                   ["plan", "status"])
GUARD_REFUSALS = Counter("parley_gateway_guard_refusals", "requests answered before routing: a body over the "
                         "size limit (reason=body_size) or a caller out of refusals (refusal_budget)", ["reason"])
RECONNECTS = Counter("parley_gateway_stream_reconnects", "streams resumed with Last-Event-ID", ["plan"])
OPEN_STREAMS = Gauge("parley_gateway_open_streams", "SSE streams open on this gateway")
TAIL_RECORDS = Counter("parley_gateway_tail_records", "records of chat.tokens this gateway's tails fetched: of "
                       "the partitions it owns (kind=owned) or of others' while a stream here reads them (borrowed)",
                       ["kind"])
STOP_REASONS = {"complete": "end", "stopped": "stopped", "length": "length", "failed": "error"}


@dataclass
class ReplyWatch:
    """Follows one reply's events as the gateway relays them and records what the user experienced."""

    plan: str
    pool: str
    accepted_at: float = field(default_factory=time.monotonic)
    first_delta_at: float | None = None
    done: bool = False
    shown: tuple[float, float] | None = None  # (when, seconds): the first wait a queued reply was shown

    def seen(self, event: Any) -> None:
        now = time.monotonic()
        if isinstance(event, GenerationQueued):
            self.pool = event.pool  # overflow or a prepared reply: the pool that really answers
            if event.position > 0 and self.shown is None:
                self.shown = (now, event.estimated_wait_s)
        elif isinstance(event, TokensAppended) and event.text and self.first_delta_at is None:
            self.first_delta_at = now
            TTFT.labels(plan=self.plan, pool=self.pool).observe(now - self.accepted_at)
            if self.shown is not None:
                QUEUED_WAIT_ERROR.labels(plan=self.plan, pool=self.pool).observe(now - self.shown[0] - self.shown[1])
        elif isinstance(event, GenerationFinished) and not self.done:
            self.done = True
            out = event.usage.completion_tokens
            REPLY_ENDS.labels(plan=self.plan, pool=self.pool, stop_reason=STOP_REASONS.get(event.status, "end")).inc()
            TOKENS.labels(plan=self.plan, pool=self.pool).inc(out)
            if self.first_delta_at is not None and out > 1 and now > self.first_delta_at:
                STREAM_RATE.labels(plan=self.plan, pool=self.pool).observe(out / (now - self.first_delta_at))
        elif isinstance(event, RequestRefused) and not self.done:
            self.done = True
            refused(self.plan, event.status)


def declare(plans: list[str], pools: list[str]) -> None:
    """Every plan's and pool's series exist from the start at 0, so the first reply's tokens are an increase that
    ``rate()`` sees, not a series that appears already at its value (and rates 0 until the next reply)."""
    for plan in plans:
        RECONNECTS.labels(plan=plan)
        for pool in pools:
            for series in (TOKENS, TTFT, STREAM_RATE, QUEUED_WAIT_ERROR):
                series.labels(plan=plan, pool=pool)


def refused(plan: str, status: int) -> None:
    REFUSALS.labels(plan=plan, status=str(status)).inc()


def reconnected(plan: str) -> None:
    RECONNECTS.labels(plan=plan).inc()
