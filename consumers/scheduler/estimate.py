"""How long a queued request waits for its first token: the pure model behind the ``queued`` event.

A pool's workers each hold ``slots`` requests at once (the engine's batch and the few waiting inside it,
``PoolConfig.held_requests``). While every slot is taken a slot frees each time a reply ends, so a request
``position`` places down the queue (every waiting request of a higher lane and its own lane's earlier ones
are ahead of it) is taken by a worker after ``position`` replies end, then waits ``F`` for its first token
(the engine's own queue and the prefill). A lower lane moves at what is left of the rate once the requests
arriving in higher lanes meanwhile (measured over the last minute) are taken before it:

    wait = position / (rate - inflow above) + F,   rate = replicas x slots / T

``T`` (a reply's time in a worker: taken -> ended) and ``F`` (taken -> first token) are means over the pool's
recent replies, whatever their load: they need no full pool to be measured, unlike a count of replies per
second, which only says the pool's rate once it has been full for the whole window. ``replicas`` is Little's
law on that count: replies ended in the last minute x ``T`` is how many requests the workers held, and more
than one replica's slots means more replicas (rounded, so noise does not add one). Before three replies have
ended ``T`` is the prior, or the age of the oldest request running if longer: it has not ended, so a reply
takes at least that long.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

MIN_SAMPLES = 3  # replies ended before their mean replaces the prior


@dataclass(frozen=True)
class Completion:
    at: float  # when the scheduler heard the reply end (its own clock)
    held_s: float  # taken by a worker -> ended (the worker's clock); 0: never taken (refused, dropped)
    first_token_s: float  # taken -> first token; 0: none
    ours: bool = True  # queued by this scheduler: counts in the pool's measured rate


@dataclass
class ServiceHistory:
    """A pool's recent replies: what its service rate and first-token time are estimated from."""

    slots: int  # requests one replica's worker holds at once
    prior_held_s: float = 20.0  # a reply's time in a worker before any has ended
    window_s: float = 60.0  # replies counted for the pool's measured rate (and so its replicas)
    keep: int = 200  # the latest replies whose means are taken
    completions: deque[Completion] = field(default_factory=deque)

    def record(self, completion: Completion) -> None:
        self.completions.append(completion)
        while len(self.completions) > self.keep:
            self.completions.popleft()

    def held_s(self, oldest_running_s: float = 0.0) -> float:
        held = [c.held_s for c in self.completions if c.held_s > 0]
        if len(held) < MIN_SAMPLES:
            return max(self.prior_held_s, oldest_running_s)
        return sum(held) / len(held)

    def first_token_s(self) -> float:
        firsts = [c.first_token_s for c in self.completions if c.first_token_s > 0]
        return sum(firsts) / len(firsts) if firsts else 0.0

    def replicas(self, now: float, held_s: float) -> int:
        ended = sum(1 for c in self.completions if c.ours and c.at >= now - self.window_s)
        return max(1, round(ended / self.window_s * held_s / self.slots))

    def pace(self, now: float, oldest_running_s: float = 0.0) -> Pace:
        """The pool's pace now: taken once per decision (or per refresh of every waiting request)."""
        held = self.held_s(oldest_running_s)
        capacity = self.replicas(now, held) * self.slots
        return Pace(capacity=capacity, rate=capacity / held, first_token_s=self.first_token_s())


@dataclass(frozen=True)
class Pace:
    capacity: int  # requests the pool's workers hold at once
    rate: float  # replies ended per second while every slot is taken
    first_token_s: float  # taken by a worker -> first token

    def wait_s(self, position: int, inflow_above: float = 0.0) -> float:
        """Seconds until the first token of the request ``position`` places down the queue (0: not waiting).
        ``inflow_above``: requests a second arriving in higher lanes, each of which will be taken before it
        (so a lower lane moves at what is left of the rate, at least a tenth of it)."""
        if position <= 0:
            return 0.0
        return position / max(self.rate - inflow_above, self.rate / 10) + self.first_token_s
