"""Pure queue logic of the scheduler: lane backlogs, service rate, wait estimates, routing.

The queue itself is the ``generate.<pool>.<lane>`` topics; this module keeps the
counts needed to estimate a newcomer's wait (queue length / service rate) and
decides where it goes: its pool, the small pool on overflow, or a refusal.
"""
from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field

from schemas.scheduler import LANES  # paid is served first


@dataclass
class PoolLoad:
    capacity: int  # sequences the pool's replicas run at once
    outstanding: dict[str, dict[str, str]] = field(default_factory=lambda: {lane: {} for lane in LANES})
    completions: deque[float] = field(default_factory=deque)
    prior_rate: float = 1.0  # replies/s assumed before any completion has been seen

    def waiting(self, lane: str) -> int:
        """Requests of ``lane`` not yet running: everything past the engine's capacity, paid first."""
        paid = len(self.outstanding["paid"])
        if lane == "paid":
            return max(0, paid - self.capacity)
        return max(0, paid + len(self.outstanding["free"]) - self.capacity) - max(0, paid - self.capacity)

    def ahead_of_new(self, lane: str) -> int:
        ahead = self.waiting("paid")
        if lane == "free":
            ahead += self.waiting("free")
        return ahead

    def busy(self) -> bool:
        return sum(len(o) for o in self.outstanding.values()) >= self.capacity

    def rate(self, now: float, window_s: float = 60.0) -> float:
        while self.completions and self.completions[0] < now - window_s:
            self.completions.popleft()
        if len(self.completions) < 3:
            return self.prior_rate
        span = max(now - self.completions[0], 1.0)
        return max(len(self.completions) / span, 0.01)

    def estimate_wait(self, lane: str, now: float) -> tuple[int, float]:
        """(position, seconds): 0 when a slot is free now."""
        if not self.busy():
            return 0, 0.0
        position = self.ahead_of_new(lane) + 1
        return position, position / self.rate(now)


@dataclass(frozen=True)
class Route:
    pool: str
    lane: str
    position: int
    wait_s: float
    reason: str  # requested | default | classifier | overflow


@dataclass(frozen=True)
class Refuse:
    wait_s: float
    message: str


class Queues:
    def __init__(self, pools: dict[str, PoolLoad], overflow_pool: str = "small") -> None:
        self.pools, self.overflow_pool = pools, overflow_pool
        self.where: dict[str, tuple[str, str]] = {}  # generation_id -> (pool, lane)

    def route(self, pool: str, lane: str, limit_s: float, reason: str, now: float | None = None,
              can_overflow: bool = True) -> Route | Refuse:
        """``can_overflow``: the request has a prompt that fits the overflow pool."""
        now = time.time() if now is None else now
        position, wait = self.pools[pool].estimate_wait(lane, now)
        if wait <= limit_s:
            return Route(pool, lane, position, wait, reason)
        if can_overflow and pool != self.overflow_pool and self.overflow_pool in self.pools:
            o_position, o_wait = self.pools[self.overflow_pool].estimate_wait(lane, now)
            if o_wait <= limit_s:
                return Route(self.overflow_pool, lane, o_position, o_wait, "overflow")
        return Refuse(wait, f"Every model is busy: the wait would be about {wait:.0f} s, over this plan's "
                            f"limit of {limit_s:.0f} s. Try again in a moment.")

    def enqueued(self, generation_id: str, pool: str, lane: str) -> None:
        self.pools[pool].outstanding[lane][generation_id] = lane
        self.where[generation_id] = (pool, lane)

    def finished(self, generation_id: str, now: float | None = None) -> None:
        placed = self.where.pop(generation_id, None)
        if placed is None:
            return  # not ours (another scheduler instance, or before a restart)
        pool, lane = placed
        self.pools[pool].outstanding[lane].pop(generation_id, None)
        self.pools[pool].completions.append(time.time() if now is None else now)
