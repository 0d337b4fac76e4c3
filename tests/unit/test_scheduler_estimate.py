"""The shown wait against the wait a FIFO really gives: a small deterministic simulation of one pool.

The pool is what the workers do: a worker holds ``held`` requests, its engine runs ``seqs`` of them, paid lane
first and first in first out within a lane, in Kafka and in the engine alike; each reply holds its sequence a
random time and its first token comes a random time after its sequence starts. The
scheduler's ``Queues`` sees only what it sees in production (each request queued, each reply's end with its
times) and is asked each newcomer's wait; the simulation says when its first token really came.
"""
from __future__ import annotations

import heapq
import random
import statistics
from collections import deque
from dataclasses import dataclass, field

from consumers.scheduler.estimate import Completion
from consumers.scheduler.queueing import PoolLoad, Queues

Arrival = tuple[float, str]  # (when, lane)


@dataclass
class Shown:
    lane: str
    arrived: float
    position: int
    shown_s: float
    true_s: float = 0.0


@dataclass
class Pool:
    """The real pool and the scheduler's view of it, driven by one clock. The worker holds ``held`` requests;
    its engine runs ``seqs`` of them and the rest wait inside it (paid first), as in ``held_requests``."""

    seqs: int
    held: int
    service_s: tuple[float, float]  # a reply's time in its engine sequence: uniform between these
    first_token_s: tuple[float, float] = (0.3, 1.5)  # from its sequence's start: its prefill
    seed: int = 7
    shown: dict[str, Shown] = field(default_factory=dict)
    events: list[tuple[float, int, str]] = field(default_factory=list)  # (when, n, generation id)

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)
        prior = sum(self.service_s) / 2
        self.queues = Queues({"large": PoolLoad.of(self.seqs, self.held, prior_s=prior)})
        self.kafka: dict[str, deque[str]] = {"paid": deque(), "free": deque()}
        self.engine: dict[str, deque[str]] = {"paid": deque(), "free": deque()}
        self.in_worker, self.running = 0, 0
        self.taken: dict[str, float] = {}
        self.times: dict[str, tuple[float, float]] = {}  # generation id -> (first token at, end at)

    def run(self, arrivals: list[Arrival]) -> list[Shown]:
        for n, (at, lane) in enumerate(arrivals):
            self._arrive(f"{lane}-{n}", at, arrivals[n + 1][0] if n + 1 < len(arrivals) else float("inf"))
        self._until(float("inf"))
        return list(self.shown.values())

    def _until(self, limit: float) -> None:
        while self.events and self.events[0][0] <= limit:
            now, _, gid = heapq.heappop(self.events)
            self._end(gid, now)

    def _arrive(self, gid: str, now: float, next_at: float) -> None:
        self._until(now)
        lane = gid.split("-")[0]
        position, wait = self.queues.pools["large"].estimate_wait(lane, now)
        self.queues.enqueued(gid, "large", lane, now=now)
        self.shown[gid] = Shown(lane, now, position, wait)
        if self.in_worker < self.held:
            self._take(gid, now)
        else:
            self.kafka[lane].append(gid)

    def _take(self, gid: str, now: float) -> None:
        self.in_worker += 1
        self.taken[gid] = now
        if self.running < self.seqs:
            self._start(gid, now)
        else:
            self.engine[self.shown[gid].lane].append(gid)

    def _start(self, gid: str, now: float) -> None:
        self.running += 1
        first = now + self.rng.uniform(*self.first_token_s)
        end = now + self.rng.uniform(*self.service_s)
        self.times[gid] = (first, end)
        self.shown[gid].true_s = first - self.shown[gid].arrived
        heapq.heappush(self.events, (end, len(self.times), gid))

    def _end(self, gid: str, now: float) -> None:
        self.running, self.in_worker = self.running - 1, self.in_worker - 1
        first, _ = self.times[gid]
        taken = self.taken[gid]
        self.queues.finished(gid, Completion(now, now - taken, first - taken), "large")
        for queue, action in ((self.engine, self._start), (self.kafka, self._take)):
            lane = next((ln for ln in ("paid", "free") if queue[ln]), None)
            if lane is not None:
                action(queue[lane].popleft(), now)


def poisson(rate: float, start: float, seconds: float, rng: random.Random, paid_share: float = 0.0) -> list[Arrival]:
    out, at = [], start
    while (at := at + rng.expovariate(rate)) < start + seconds:
        out.append((at, "paid" if rng.random() < paid_share else "free"))
    return out


def error(shown: list[Shown]) -> float:
    """The median of |shown - true| / true."""
    return statistics.median(abs(s.shown_s - s.true_s) / s.true_s for s in shown)


def seconds_off(shown: list[Shown]) -> float:
    return statistics.median(abs(s.shown_s - s.true_s) for s in shown)


def queued(shown: list[Shown], after: float = 0.0, lane: str | None = None) -> list[Shown]:
    return [s for s in shown if s.position > 0 and s.arrived >= after and lane in (None, s.lane)]


def test_a_steady_queue_is_shown_its_true_wait() -> None:
    # 16 sequences (the worker holds 18), replies of 10-50 s: 0.53 a second; 0.6 arrive: the queue grows by
    # about 4 a minute
    rng = random.Random(1)
    shown = Pool(seqs=16, held=18, service_s=(10, 50)).run(poisson(0.6, 0, 1500, rng))
    steady = queued(shown, after=300)
    assert len(steady) > 500
    assert error(steady) <= 0.25
    assert statistics.median(s.true_s for s in steady) > 30  # a real queue, not a few seconds


def test_the_seeds_spike_at_a_tenth_is_shown_its_true_wait() -> None:
    # The load test's spike: 3.5 -> 7 -> 3.5 requests a second on a replica of 120 sequences (its worker holds
    # 135) serving ~5 a second
    rng = random.Random(2)
    load = poisson(3.5, 0, 20, rng) + poisson(7.0, 20, 60, rng) + poisson(3.5, 80, 20, rng)
    shown = Pool(seqs=120, held=135, service_s=(14, 34)).run(load)
    waited = queued(shown)
    assert len(waited) > 100 and max(s.true_s for s in waited) > 10
    assert error(waited) <= 0.25


def test_paid_ahead_of_free_each_lane_is_shown_its_true_wait() -> None:
    rng = random.Random(3)
    shown = Pool(seqs=16, held=18, service_s=(10, 50)).run(poisson(0.6, 0, 1500, rng, paid_share=0.3))
    paid, free = queued(shown, after=300, lane="paid"), queued(shown, after=300, lane="free")
    assert len(paid) > 100 and len(free) > 100
    assert error(free) <= 0.25
    # Paid waits are a few seconds: which of the 16 replies ends next is luck, so they are judged in seconds.
    assert statistics.median(s.true_s for s in paid) < 8 and seconds_off(paid) <= 2.0
    assert statistics.median(s.true_s for s in free) > 20 * statistics.median(s.true_s for s in paid)


def test_the_shown_wait_is_revised_only_when_its_countdown_is_off() -> None:
    q = Queues({"large": PoolLoad.of(1)})
    for i in range(5):  # replies of 2 s: 0.5 a second, first tokens at once
        q.enqueued(f"d{i}", "large", "free", now=i * 2)
        q.finished(f"d{i}", Completion(i * 2 + 2, 2.0, 0.0), "large")
    for i in range(11):
        q.enqueued(f"w{i}", "large", "free", now=10)
    for gid, _, position in list(q.pools["large"].positions(1)):
        q.shown(gid, 2.0 * position, now=10)
    for i in range(3):  # the queue moves as shown: nothing to send
        q.finished(f"w{i}", Completion(12 + i * 2, 2.0, 0.0), "large")
    assert q.revised(now=16) == []
    revised = q.revised(now=30)  # then nothing ends for 14 s: every countdown is off
    assert [(gid, position) for gid, position, _ in revised][:2] == [("w4", 1), ("w5", 2)]
    assert q.revised(now=31) == []  # not again within REVISE_GAP_S
