"""What a lab run comes to: completed requests, tokens/s, time to first token, time queued.

Requests still waiting (or still without a first token) when the window closes are counted with the
time they had waited so far, so the percentiles are lower bounds, not flattered by dropping the worst.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from infra.planning.lab.sim import Progress, Run


@dataclass(frozen=True)
class Summary:
    mode: str
    arrived: int
    completed: int
    unfinished: int  # admitted but not done at the end
    never_started: int  # still queued at the end
    tokens_per_s: float
    ttft_p50_s: float
    ttft_p95_s: float
    queue_p50_s: float
    queue_p95_s: float
    longest_step_ms: float  # the worst stutter a streaming user sees


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile: always one of the observed values."""
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q / 100 * len(ordered)) - 1)]


def _waited(p: Progress, until: float | None, end_s: float) -> float:
    return (until if until is not None else end_s) - p.request.arrival_s


def summarize(run: Run) -> Summary:
    end_s = run.config.duration_s
    reqs = run.requests
    ttft = [_waited(p, p.first_token_s, end_s) for p in reqs]
    queued = [_waited(p, p.admitted_s, end_s) for p in reqs]
    return Summary(
        mode=str(run.mode),
        arrived=len(reqs),
        completed=sum(p.finished_s is not None for p in reqs),
        unfinished=sum(p.admitted_s is not None and p.finished_s is None for p in reqs),
        never_started=sum(p.admitted_s is None for p in reqs),
        tokens_per_s=sum(s.tokens for s in run.steps) / end_s,
        ttft_p50_s=percentile(ttft, 50),
        ttft_p95_s=percentile(ttft, 95),
        queue_p50_s=percentile(queued, 50),
        queue_p95_s=percentile(queued, 95),
        longest_step_ms=max(((s.end_s - s.start_s) * 1000 for s in run.steps), default=0.0),
    )
