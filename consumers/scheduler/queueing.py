"""Pure queue logic of the scheduler: what each pool's workers hold, each lane's FIFO, routing, revisions.

The queue itself is the ``generate.<pool>.<lane>`` topics; this module mirrors it to tell a newcomer its place
and wait (``estimate``), to decide where it goes (its pool, the small pool on overflow, or a refusal), and to
say which waiting requests were shown a wait that, counted down, is no longer true.

The mirror follows the workers' own rule: a worker holds up to ``held_requests``, takes the paid lane first and
each lane in order. A request is ``running`` once the mirror has a worker slot for it (at once, or when a reply
ends), ``waiting`` in Kafka until then. Its position counts what is ahead of it past the engines' sequences:
the held requests beyond them (they wait inside the engine) and the waiting ones ahead, plus one.
"""
from __future__ import annotations

import time
from collections import Counter, deque
from collections.abc import Collection, Iterator
from dataclasses import dataclass, field
from itertools import takewhile

from consumers.scheduler.estimate import Completion, Pace, ServiceHistory
from schemas.scheduler import LANES, Lane  # paid is served first

REVISE_OFF_S = 3.0  # a shown wait, counted down, this far off (and a quarter) is sent again
REVISE_GAP_S = 5.0  # never sooner than this after the last one shown to the same request
# A request held or waiting this long has ended unheard (its finish lost, or published before a restart):
# forgotten, so it does not stand in every later request's position for good. Reservations expire in 5 minutes.
FORGET_S = 900.0
DOWN_RETRY_S = 30.0  # a pool with no replica: told to come back after about a worker's restart (its engine's load)


@dataclass
class PoolLoad:
    history: ServiceHistory
    held: int  # requests one replica's worker holds (its engine's sequences and the few waiting inside it)
    running: dict[str, tuple[float, str]] = field(default_factory=dict)  # id -> (when a worker took it, lane)
    running_in: Counter[str] = field(default_factory=Counter)  # lane -> how many of ``running``
    # id -> when its engine sequence started: at once if one was free when a worker took it, else when one freed
    # (a held request waits inside the engine meanwhile, and that wait is not time in its sequence)
    started: dict[str, float] = field(default_factory=dict)
    waiting: dict[str, dict[str, float]] = field(default_factory=lambda: {lane: {} for lane in LANES})
    arrivals: dict[str, deque[float]] = field(default_factory=lambda: {lane: deque() for lane in LANES})

    @classmethod
    def of(cls, seqs: int, held: int | None = None, prior_s: float = 20.0) -> PoolLoad:
        return cls(ServiceHistory(seqs, prior_s), held or seqs)

    def pace(self, now: float) -> Pace:
        """The pool's pace, every worker slot that freed meanwhile given to the head of the queue, and every engine
        sequence that is free to a held request (paid first). Ages are time in a sequence, not in a worker."""
        pace = self.history.pace(now, self._ages(now))
        for lane in LANES:
            queue = self.waiting[lane]
            while queue and len(self.running) < pace.replicas * self.held:
                generation_id = next(iter(queue))
                del queue[generation_id]
                self.running[generation_id] = (now, lane)
                self.running_in[lane] += 1
        if self._start(pace.seqs, now):
            pace = self.history.pace(now, self._ages(now))
        return pace

    def _ages(self, now: float) -> list[float]:
        """How long each engine sequence has run, oldest first."""
        return sorted((now - at for at in self.started.values()), reverse=True)

    def _start(self, seqs: int, now: float) -> bool:
        """Held requests given the free engine sequences at ``now``, paid lane first; whether any was."""
        free = seqs - len(self.started)
        if free <= 0 or len(self.started) == len(self.running):
            return False
        held = [(LANES.index(lane), taken, generation_id) for generation_id, (taken, lane) in self.running.items()
                if generation_id not in self.started]
        for _, _, generation_id in sorted(held)[:free]:
            self.started[generation_id] = now
        return True

    def enqueue(self, generation_id: str, lane: Lane, now: float) -> None:
        if generation_id in self.running or any(generation_id in q for q in self.waiting.values()):
            return  # a redelivery: already in place
        self.waiting[lane][generation_id] = now
        self.arrivals[lane].append(now)
        self._forget_arrivals(lane, now)
        self.pace(now)

    def _forget_arrivals(self, lane: Lane, now: float) -> None:
        seen = self.arrivals[lane]
        while seen and seen[0] < now - self.history.window_s:
            seen.popleft()

    def inflow_above(self, lane: Lane, now: float) -> float:
        """Requests a second queued over the last window in the lanes served before ``lane``."""
        count = 0
        for above in LANES[: LANES.index(lane)]:
            self._forget_arrivals(above, now)
            count += len(self.arrivals[above])
        return count / self.history.window_s

    def forget(self, before: float) -> None:
        """Drops requests taken or queued before ``before`` (each dict is oldest first)."""
        for generation_id, _ in list(takewhile(lambda item: item[1][0] < before, self.running.items())):
            self.finish(generation_id)
        for queue in self.waiting.values():
            for generation_id, _ in list(takewhile(lambda item: item[1] < before, queue.items())):
                del queue[generation_id]

    def finish(self, generation_id: str, now: float | None = None) -> bool:
        """Frees its slot (or its place), and its engine sequence to the next held request; False if it was
        not here."""
        taken = self.running.pop(generation_id, None)
        if taken is not None:
            self.running_in[taken[1]] -= 1
            if self.started.pop(generation_id, None) is not None:
                self._start(len(self.started) + 1, time.time() if now is None else now)
            return True
        return any(q.pop(generation_id, None) is not None for q in self.waiting.values())

    def in_engine_queue(self, lane: Lane, seqs: int) -> int:
        """Held requests waiting inside the engines that go before a newcomer of ``lane``: the engine starts
        higher lanes first, so its waiting ones are the lower lanes' as far as they go."""
        waiting, lower = max(0, len(self.running) - seqs), 0
        for ln in LANES[LANES.index(lane) + 1:]:
            lower += self.running_in[ln]
        return max(0, waiting - lower)

    def position_of_new(self, lane: Lane, seqs: int) -> int:
        """0 when an engine sequence is free now; else the requests that go before it (waiting inside an engine
        or in Kafka, in ``lane`` and higher lanes), plus one."""
        if len(self.running) < seqs:
            return 0
        above = LANES[: LANES.index(lane) + 1]
        return self.in_engine_queue(lane, seqs) + sum(len(self.waiting[ln]) for ln in above) + 1

    def positions(self, seqs: int) -> Iterator[tuple[str, str, int]]:
        """Each request still in Kafka, its lane and its position, paid lane first."""
        in_kafka = 0
        for lane in LANES:
            ahead = self.in_engine_queue(lane, seqs) + in_kafka
            for generation_id in self.waiting[lane]:
                ahead += 1
                yield generation_id, lane, ahead
            in_kafka += len(self.waiting[lane])

    def estimate_wait(self, lane: Lane, now: float) -> tuple[int, float]:
        """(position, seconds to the first token): 0 when a slot is free now."""
        pace = self.pace(now)
        position = self.position_of_new(lane, pace.seqs)
        return position, pace.wait_s(position, self.inflow_above(lane, now))


@dataclass(frozen=True)
class Shown:
    at: float
    wait_s: float


@dataclass(frozen=True)
class Route:
    pool: str
    lane: Lane
    position: int
    wait_s: float
    reason: str  # requested | default | classifier | overflow


@dataclass(frozen=True)
class Refuse:
    wait_s: float
    message: str
    down: bool = False  # the pool has no replica (not a busy one)


class Queues:
    def __init__(self, pools: dict[str, PoolLoad], overflow_pool: str = "small") -> None:
        self.pools, self.overflow_pool = pools, overflow_pool
        self.where: dict[str, tuple[str, str]] = {}  # generation_id -> (pool, lane)
        self.told: dict[str, Shown] = {}  # generation_id -> the wait its client was last shown

    def route(self, pool: str, lane: Lane, limit_s: float, reason: str, now: float | None = None,
              can_overflow: bool = True, down: Collection[str] = ()) -> Route | Refuse:
        """``can_overflow``: the request has a prompt that fits the overflow pool. ``down``: pools whose every
        replica has gone (none announced any more): past every limit, since nothing there would start a
        request before its worker is back, and its estimate only shrinks as the requests stuck there age."""
        now = time.time() if now is None else now
        position, wait = self.pools[pool].estimate_wait(lane, now)
        if wait <= limit_s and pool not in down:
            return Route(pool, lane, position, wait, reason)
        overflow = self.overflow_pool
        if can_overflow and pool != overflow and overflow in self.pools and overflow not in down:
            o_position, o_wait = self.pools[overflow].estimate_wait(lane, now)
            if o_wait <= limit_s:
                return Route(overflow, lane, o_position, o_wait, "overflow")
        if pool in down:
            return Refuse(limit_s + DOWN_RETRY_S, f"No replica of {pool} is running just now; it is being "
                                                  f"restarted. Try again in a moment.", down=True)
        return Refuse(wait, f"Every model is busy: the wait would be about {wait:.0f} s, over this plan's "
                            f"limit of {limit_s:.0f} s. Try again in a moment.")

    def enqueued(self, generation_id: str, pool: str, lane: Lane, now: float | None = None) -> None:
        self.pools[pool].enqueue(generation_id, lane, time.time() if now is None else now)
        self.where[generation_id] = (pool, lane)

    def shown(self, generation_id: str, wait_s: float, now: float | None = None) -> None:
        """The client was told ``wait_s``: from now on it counts down."""
        self.told[generation_id] = Shown(time.time() if now is None else now, wait_s)

    def finished(self, generation_id: str, completion: Completion | None = None, pool: str | None = None) -> None:
        """A reply ended: its slot frees, and its times join its pool's history (a reply another scheduler
        queued still says how long the pool's replies take)."""
        self.told.pop(generation_id, None)
        placed = self.where.pop(generation_id, None)
        if placed is not None:
            self.pools[placed[0]].finish(generation_id, completion.at if completion is not None else None)
        load = self.pools.get(placed[0] if placed else pool or "")
        if completion is None or load is None:
            return
        if placed is not None or completion.held_s > 0:
            load.history.record(Completion(completion.at, completion.held_s, completion.first_token_s,
                                           ours=placed is not None))

    def revised(self, now: float | None = None) -> list[tuple[str, int, float]]:
        """(generation id, position, wait) of each waiting request whose shown wait, counted down, is off by
        more than REVISE_OFF_S and a quarter; each is marked shown again."""
        now = time.time() if now is None else now
        out = []
        for load in self.pools.values():
            load.forget(now - FORGET_S)
            pace = load.pace(now)
            inflow: dict[str, float] = {lane: load.inflow_above(lane, now) for lane in LANES}
            for generation_id, lane, position in load.positions(pace.seqs):
                told = self.told.get(generation_id)
                if told is None or now - told.at < REVISE_GAP_S:
                    continue
                wait = pace.wait_s(position, inflow[lane])
                if abs(wait - (told.wait_s - (now - told.at))) > max(REVISE_OFF_S, 0.25 * wait):
                    self.told[generation_id] = Shown(now, wait)
                    out.append((generation_id, position, wait))
        return out
