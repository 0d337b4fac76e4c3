"""Seed 000's spike: 12 replicas serving 50 requests/s meet a minute of 70, with a 10 s free-plan limit.

Modelled as the seed reasons about it: one first-in-first-out queue in front of the fleet, each replica
taking a new request every replicas / capacity seconds at full load (slot-level detail is sim.py's job).
With that deterministic service the wait is known on arrival, so the estimate the user is shown is the wait
they get, and a request whose estimate passes the limit goes to the small model instead of queueing.
"""

from __future__ import annotations

import heapq
import itertools
import random
from dataclasses import dataclass


@dataclass(frozen=True)
class FleetConfig:
    seed: int = 7
    replicas: int = 12
    capacity_rps: float = 50.0  # the seed's figure; `parley capacity` shows what it assumes
    base_rps: float = 35.0
    spike_rps: float = 70.0
    spike_start_s: float = 30.0
    spike_s: float = 60.0
    duration_s: float = 180.0
    wait_limit_s: float | None = 10.0  # None: everyone waits, however long
    poisson: bool = True  # False: evenly spaced arrivals, which reproduce the seed's arithmetic exactly


@dataclass(frozen=True)
class FleetRequest:
    id: int
    arrival_s: float
    estimated_wait_s: float
    start_s: float | None  # None: sent to the small model

    @property
    def overflowed(self) -> bool:
        return self.start_s is None


@dataclass(frozen=True)
class FleetRun:
    config: FleetConfig
    requests: tuple[FleetRequest, ...]

    @property
    def overflowed(self) -> int:
        return sum(r.overflowed for r in self.requests)

    @property
    def served(self) -> int:
        return len(self.requests) - self.overflowed

    @property
    def max_wait_s(self) -> float:
        return max((r.estimated_wait_s for r in self.requests if not r.overflowed), default=0.0)


def _rate(c: FleetConfig, t: float) -> float:
    return c.spike_rps if c.spike_start_s <= t < c.spike_start_s + c.spike_s else c.base_rps


def arrivals(c: FleetConfig) -> list[float]:
    """Arrival times, piecewise constant rate; each segment drawn on its own (Poisson is memoryless)."""
    rng = random.Random(c.seed)
    edges = [0.0, c.spike_start_s, c.spike_start_s + c.spike_s, c.duration_s]
    out: list[float] = []
    for lo, hi in itertools.pairwise(edges):
        rate, t = _rate(c, lo), lo
        while True:
            t += rng.expovariate(rate) if c.poisson else 1 / rate
            if t >= hi:
                break
            out.append(t)
    return out


def simulate_fleet(c: FleetConfig) -> FleetRun:
    service_s = c.replicas / c.capacity_rps
    free_at = [0.0] * c.replicas  # when each replica can next take a request
    out: list[FleetRequest] = []
    for i, t in enumerate(arrivals(c)):
        start = max(t, free_at[0])
        wait = start - t
        if c.wait_limit_s is not None and wait > c.wait_limit_s:
            out.append(FleetRequest(i, t, wait, None))
            continue
        heapq.heapreplace(free_at, start + service_s)
        out.append(FleetRequest(i, t, wait, start))
    return FleetRun(c, tuple(out))


def queue_series(run: FleetRun, every_s: float = 0.25) -> tuple[list[float], list[int]]:
    """Requests waiting for the large model (arrived, not overflowed, not yet started) over time."""
    served = [r for r in run.requests if not r.overflowed]
    arrived = sorted(r.arrival_s for r in served)
    started = sorted(r.start_s for r in served if r.start_s is not None)
    times, lengths, a, s = [], [], 0, 0
    for k in range(int(run.config.duration_s / every_s) + 1):
        t = k * every_s
        while a < len(arrived) and arrived[a] <= t:
            a += 1
        while s < len(started) and started[s] <= t:
            s += 1
        times.append(t)
        lengths.append(a - s)
    return times, lengths
