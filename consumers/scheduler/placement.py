"""Which replica of a pool serves a generation, pure: no broker, no store, no clock.

A replica is one generation worker: it owns some partitions of ``generate.<pool>.<lane>`` (Kafka's group
assignment) and announces them (``consumers.generation.announce``). The scheduler places a generation on a
replica by the pool's ``routing`` policy, then writes it to one of that replica's partitions:

- ``random``: any replica, uniformly (the baseline: a follow-up turn finds its prefix cache one time in n);
- ``conversation``: consistent hashing with bounded loads (Mirrokni, Thorup, Zadimoghaddam 2018; KubeAI's
  prefix routing): the conversation's home on a ring of the replicas, unless the home already holds
  ``ceil(c * (total + 1) / n)`` requests, then the least-loaded replica. A replica joining or leaving moves
  only the conversations whose home it is or becomes (about 1/n of them);
- ``cache-aware``: each replica under the cap scored by the share of the prompt whose blocks it holds, less
  its queue against the cap (llm-d's and Dynamo's prefix and queue scorers); ties go to the ring's order, so
  a new conversation starts at its home and its next turns follow the cache.
"""
from __future__ import annotations

import bisect
import hashlib
import math
import random
from collections.abc import Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

Routing = Literal["random", "conversation", "cache-aware"]
ROUTINGS: tuple[Routing, ...] = ("random", "conversation", "cache-aware")
VNODES = 64  # points per replica on the ring: shares within a few percent of 1/n
LOAD_CAP = 1.25  # c: no replica takes more than 1.25x the mean load (KubeAI's default)
PREFIX_WEIGHT = 2.0  # the cache-aware score: 2 x (share of the prompt held) - 1 x (queue / cap)
QUEUE_WEIGHT = 1.0


def _point(text: str) -> int:
    """A position on the ring, alike in every process (``hash`` of a str is salted per process)."""
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "big")


class Ring:
    """The replicas on a hash ring, VNODES points each."""

    def __init__(self, replicas: Collection[str], vnodes: int = VNODES) -> None:
        self.replicas = frozenset(replicas)
        points = sorted((_point(f"{r}#{i}"), r) for r in self.replicas for i in range(vnodes))
        self._keys = [p for p, _ in points]
        self._owners = [r for _, r in points]

    def walk(self, key: str) -> Iterator[str]:
        """Each replica once, clockwise from ``key``'s point: its home first."""
        if not self._keys:
            return
        seen: set[str] = set()
        start = bisect.bisect(self._keys, _point(key))
        for i in range(len(self._keys)):
            owner = self._owners[(start + i) % len(self._keys)]
            if owner not in seen:
                seen.add(owner)
                yield owner
                if len(seen) == len(self.replicas):
                    return

    def home(self, key: str) -> str:
        return next(self.walk(key))


def load_cap(loads: Mapping[str, int], c: float = LOAD_CAP, floor: int = 1) -> int:
    """The most requests one replica may hold once the next is placed: c x the mean, rounded up, and never
    under ``floor`` (a few sequences more in a batch cost a replica little; a cold cache costs the prefill)."""
    return max(floor, math.ceil(c * (sum(loads.values()) + 1) / max(1, len(loads))))


@dataclass(frozen=True)
class Placement:
    replica: str
    reason: Literal["home", "spill", "cache", "random"]
    held_share: float = 0.0  # the share of the prompt the replica was known to hold


def bounded(ring: Ring, key: str, loads: Mapping[str, int], c: float = LOAD_CAP, floor: int = 1) -> Placement:
    """The key's home, or the least-loaded replica when the home is at the cap (ties: ring order)."""
    cap = load_cap(loads, c, floor)
    order = list(ring.walk(key))
    home = order[0]
    if loads.get(home, 0) + 1 <= cap:
        return Placement(home, "home")
    return Placement(min(order, key=lambda r: loads.get(r, 0)), "spill")


def held_share(prompt_hashes: Sequence[int], held: Collection[int]) -> float:
    """The share of the prompt's full blocks that start it and that a replica holds: the deepest block whose
    chain hash it announced (a chain hash covers every block before it)."""
    for i in range(len(prompt_hashes) - 1, -1, -1):
        if prompt_hashes[i] in held:
            return (i + 1) / len(prompt_hashes)
    return 0.0


def cache_aware(ring: Ring, key: str, prompt_hashes: Sequence[int], held: Mapping[str, Collection[int]],
                loads: Mapping[str, int], c: float = LOAD_CAP, floor: int = 1) -> Placement:
    """The replica under the cap with the best score: PREFIX_WEIGHT x the share of the prompt it holds less
    QUEUE_WEIGHT x its load against the cap; ties go to ring order from the conversation's home."""
    cap = load_cap(loads, c, floor)
    order = list(ring.walk(key))
    open_ = [r for r in order if loads.get(r, 0) + 1 <= cap] or order
    shares = {r: held_share(prompt_hashes, held.get(r, ())) for r in open_}
    best = max(open_, key=lambda r: (PREFIX_WEIGHT * shares[r] - QUEUE_WEIGHT * loads.get(r, 0) / cap,
                                     -order.index(r)))
    if shares[best] > 0:
        return Placement(best, "cache", shares[best])
    return Placement(best, "home" if best == order[0] else "spill")


def place(routing: Routing, ring: Ring, key: str, loads: Mapping[str, int], prompt_hashes: Sequence[int] = (),
          held: Mapping[str, Collection[int]] | None = None, rng: random.Random | None = None,
          c: float = LOAD_CAP, floor: int = 1) -> Placement:
    """One generation's replica under ``routing``; ``ring`` holds at least one replica."""
    if routing == "random":
        return Placement((rng or random).choice(sorted(ring.replicas)), "random")
    if routing == "cache-aware" and prompt_hashes:
        return cache_aware(ring, key, prompt_hashes, held or {}, loads, c, floor)
    return bounded(ring, key, loads, c, floor)
