"""How long a queued request waits for its first token: the pure model behind the ``queued`` event.

A replica's engine runs ``seqs`` sequences at once (``max_num_seqs``); its worker holds a few more
(``held_requests``), which wait inside the engine. While every sequence is taken one frees each time a reply
ends, so a request with ``position - 1`` requests ahead of it beyond the engines' sequences (held or still in
Kafka; every waiting request of a higher lane and its own lane's earlier ones) starts after ``position``
replies end, and its first token comes ``P`` later (its prefill). A lower lane moves at what is left of the
rate once the requests arriving in higher lanes meanwhile (measured over the last minute) go before it:

    wait = position / (rate - inflow above) + P,   rate = replicas x seqs / T,   T = D + P

``D`` (first token -> end) is the mean over the pool's recent replies; ``P`` is the lower quartile of their
time from being taken by a worker to the first token, which is the prefill for a request that found a free
sequence and more for one that waited inside the engine. Both are measured whatever the load, unlike a count of
replies per second, which only says the pool's rate once it has been full for a whole window. ``replicas`` is
Little's law on that count: replies ended in the last minute x ``T`` is how many sequences ran, and more than
one replica's means more replicas (rounded, so noise does not add one). Before three replies have ended ``T``
is the prior, or the age of the oldest request running if longer: it has not ended, so a reply takes at least
that long.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

MIN_SAMPLES = 3  # replies ended before their times replace the prior
# A lower lane is taken to move at no less than this share of the rate. The last minute's higher-lane arrivals
# seldom go on at that pace for a whole lower-lane wait (a spike passes): in the FIFO simulation, with half the
# spike paid, a tenth gave free waits shown 4 times too long, two thirds within a third. Revisions correct it.
LOWER_LANE_SHARE = 2 / 3


@dataclass(frozen=True)
class Completion:
    at: float  # when the scheduler heard the reply end (its own clock)
    held_s: float  # taken by a worker -> ended (the worker's clock); 0: never taken (refused, dropped)
    first_token_s: float  # taken -> first token; 0: none
    ours: bool = True  # queued by this scheduler: counts in the pool's measured rate


@dataclass
class ServiceHistory:
    """A pool's recent replies: what its service rate and first-token time are estimated from."""

    seqs: int  # sequences one replica's engine runs at once
    prior_s: float = 20.0  # a reply's time in the engine before any has ended
    window_s: float = 60.0  # replies counted for the pool's measured rate (and so its replicas)
    keep: int = 200  # the latest replies whose times are taken
    completions: deque[Completion] = field(default_factory=deque)

    def record(self, completion: Completion) -> None:
        self.completions.append(completion)
        while len(self.completions) > self.keep:
            self.completions.popleft()

    def prefill_s(self) -> float:
        """P: the lower quartile of taken -> first token (0 before any reply)."""
        firsts = sorted(c.first_token_s for c in self.completions if c.first_token_s > 0)
        return firsts[len(firsts) // 4] if firsts else 0.0

    def service_s(self, prefill_s: float, ages: list[float]) -> float:
        """T: a reply's time in its engine sequence, D + P. ``ages``: how long each running request has run,
        oldest first. Until as many replies have ended as run at once, the ones that ended are the short ones
        (a long reply that started with them is still running), so T is at least twice their mean age."""
        decode = [c.held_s - c.first_token_s for c in self.completions if c.held_s > c.first_token_s]
        if len(decode) < MIN_SAMPLES:
            return max(self.prior_s, ages[0] if ages else 0.0)
        service = sum(decode) / len(decode) + prefill_s
        if len(decode) < len(ages):
            service = max(service, 2 * sum(ages) / len(ages))
        return service

    def replicas(self, now: float, service_s: float) -> int:
        ended = sum(1 for c in self.completions if c.ours and c.at >= now - self.window_s)
        return max(1, round(ended / self.window_s * service_s / self.seqs))

    def pace(self, now: float, ages: list[float] | None = None) -> Pace:
        """The pool's pace now: taken once per decision (or per round of revisions). ``ages``: how long each
        request the workers hold has been held, oldest first."""
        ages = ages or []
        prefill = self.prefill_s()
        replicas = self.replicas(now, self.service_s(prefill, ages[: self.seqs]))
        seqs = replicas * self.seqs
        service = self.service_s(prefill, ages[:seqs])
        ends = sorted(max(service - age, service / 10) for age in ages[:seqs])
        return Pace(replicas=replicas, seqs=seqs, rate=seqs / service, prefill_s=prefill, service_s=service,
                    ends=tuple(ends))


@dataclass(frozen=True)
class Pace:
    replicas: int
    seqs: int  # sequences the pool's engines run at once
    rate: float  # replies ended per second while every sequence is taken
    prefill_s: float  # a request's first token after its sequence starts
    service_s: float = 0.0  # T
    ends: tuple[float, ...] = ()  # seconds until each running sequence is expected to end, soonest first

    def wait_s(self, position: int, inflow_above: float = 0.0) -> float:
        """Seconds until the first token of the request ``position`` places past the engines' sequences
        (0: it starts now). With every sequence running, the k-th to free is the k-th soonest expected end
        (a sequence that has run past T is given a tenth of T more), each sequence freeing again T after.
        ``inflow_above``: requests a second arriving in higher lanes, each of which goes before it (so a
        lower lane moves at what is left of the rate, at least LOWER_LANE_SHARE of it)."""
        if position <= 0:
            return 0.0
        slowed = self.rate / max(self.rate - inflow_above, self.rate * LOWER_LANE_SHARE)
        if len(self.ends) < self.seqs:
            return position / self.rate * slowed + self.prefill_s
        turn, slot = divmod(position - 1, len(self.ends))
        return (self.ends[slot] + turn * self.service_s) * slowed + self.prefill_s
