"""Percentiles and summaries of what a run measured (pure)."""
from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Sequence


def pct(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100), linear between ranks; NaN for no values."""
    if not values:
        return math.nan
    xs = sorted(values)
    k = (len(xs) - 1) * q / 100
    lo, hi = int(k), min(int(k) + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def summary(values: Iterable[float | None], scale: float = 1.0) -> dict[str, float]:
    """n, p50, p90, p99, max and mean of the values given (None left out), times ``scale`` (1000 for ms)."""
    vs = [v * scale for v in values if v is not None]
    if not vs:
        return {"n": 0}
    return {"n": len(vs), "p50": round(pct(vs, 50), 2), "p90": round(pct(vs, 90), 2),
            "p99": round(pct(vs, 99), 2), "max": round(max(vs), 2), "mean": round(statistics.fmean(vs), 2)}


def per(amount: float, count: float, scale: float = 1.0) -> float | None:
    """``amount / count`` times ``scale``, or None when nothing was counted."""
    return round(amount * scale / count, 4) if count else None
