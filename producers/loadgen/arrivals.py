"""When requests arrive: a Poisson process (exponential gaps) at a rate that may change by phase.

Pure: the schedule is a list of offsets in seconds from the start, drawn from a seeded ``random.Random``, so a
run is repeatable and a test can check the rate and the bounds.
"""
from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Phase:
    """``rate`` requests a second for ``seconds``."""

    seconds: float
    rate: float


def poisson(rate: float, seconds: float, rng: random.Random, start: float = 0.0) -> list[float]:
    """Arrival offsets in ``[start, start + seconds)`` at ``rate`` a second on average."""
    if rate <= 0 or seconds <= 0:
        return []
    out: list[float] = []
    t = start
    while True:
        t += rng.expovariate(rate)
        if t >= start + seconds:
            return out
        out.append(t)


def schedule(phases: Sequence[Phase], seed: int = 0, limit: int | None = None) -> list[float]:
    """Every phase in turn; at most ``limit`` arrivals (the first ones), so a run is bounded in count too."""
    rng, out, start = random.Random(seed), [], 0.0
    for phase in phases:
        out += poisson(phase.rate, phase.seconds, rng, start)
        start += phase.seconds
    return out[:limit] if limit is not None else out


def duration(phases: Sequence[Phase]) -> float:
    return sum(p.seconds for p in phases)


def rate_at(phases: Sequence[Phase], t: float) -> float:
    """The offered rate at offset ``t`` (0 past the end)."""
    start = 0.0
    for phase in phases:
        if start <= t < start + phase.seconds:
            return phase.rate
        start += phase.seconds
    return 0.0
