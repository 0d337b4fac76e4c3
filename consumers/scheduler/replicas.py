"""A pool's replicas as the scheduler sees them: who owns which partitions (the workers' announcements), what
this scheduler has placed on each and not seen finish, and which prompt prefixes each holds.

Prefixes: a replica whose engine announces them (the simulated engine: the chain hashes of recent prefixes
still in its cache) is scored by those; one that does not (vLLM) by the prompts this scheduler sent it lately,
a bounded record of their checkpoints. The second misses evictions and other schedulers' placements, but
needs nothing from the engine.
"""
from __future__ import annotations

import random
from collections import Counter, OrderedDict
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass

from consumers.generation.announce import ReplicaAnnounced
from consumers.generation.sim_core import CHECKPOINT_BLOCKS, RECENT_PREFIXES, block_hashes
from consumers.scheduler.placement import Placement, Ring, Routing, place


@dataclass(frozen=True)
class Placed:
    partition: int
    placement: Placement


class Replicas:
    def __init__(self, routing: Routing, block_size: int = 16, rng: random.Random | None = None,
                 floor: int = 1) -> None:
        """``floor``: the load cap never below it (``placement.load_cap``)."""
        self.routing, self.block_size, self.rng, self.floor = routing, block_size, rng or random.Random(), floor
        self.announced: dict[str, ReplicaAnnounced] = {}
        self.rings: dict[str, Ring] = {}  # topic -> the replicas owning a partition of it
        self.loads: Counter[str] = Counter()  # replica -> generations placed here, not finished
        self.on: dict[str, str] = {}  # generation_id -> replica
        self.sent: dict[str, OrderedDict[int, None]] = {}  # replica -> checkpoints of prompts sent to it
        self.prefixes: dict[str, frozenset[int]] = {}  # replica -> the prefixes its engine announced
        self.seen = False  # a replica has announced since this scheduler started

    @property
    def down(self) -> bool:
        """Every replica has gone: one announced, and none does now (their keys expired). Before the first
        announcement (a fleet still loading its engines) a pool is not down: its requests wait in its queue."""
        return self.seen and not self.announced

    def update(self, announcements: Iterable[ReplicaAnnounced]) -> None:
        """The latest announcements; a replica missing from them has left (its load is forgotten with it)."""
        self.announced = {a.worker_id: a for a in announcements}
        self.seen = self.seen or bool(self.announced)
        self.prefixes = {r: frozenset(a.prefixes) for r, a in self.announced.items() if a.prefixes is not None}
        owners: dict[str, set[str]] = {}
        for a in self.announced.values():
            for topic, partitions in a.partitions.items():
                if partitions:
                    owners.setdefault(topic, set()).add(a.worker_id)
        self.rings = {t: self.rings[t] if t in self.rings and self.rings[t].replicas == frozenset(ids) else Ring(ids)
                      for t, ids in owners.items()}
        for gone in set(self.loads) - set(self.announced):
            del self.loads[gone]
        for gone in set(self.sent) - set(self.announced):
            del self.sent[gone]

    def place(self, topic: str, conversation_id: str, generation_id: str,
              prompt: Sequence[int] | str) -> Placed | None:
        """The replica and the partition of ``topic`` a generation goes to; None when no replica announced one."""
        ring = self.rings.get(topic)
        if ring is None:
            return None
        hashes = block_hashes(prompt, self.block_size) if self.routing == "cache-aware" and \
            not isinstance(prompt, str) else []
        loads = {r: self.loads[r] for r in ring.replicas}
        placement = place(self.routing, ring, conversation_id, loads, hashes, self._held(ring.replicas), self.rng,
                          floor=self.floor)
        owned = self.announced[placement.replica].partitions[topic]
        self.loads[placement.replica] += 1
        self.on[generation_id] = placement.replica
        if hashes:
            self._sent(placement.replica, hashes)
        # The replica's first partition of the lane, whichever conversation: its worker then takes the lane's
        # requests in the order they were queued (across several partitions it takes whichever its fetch
        # returns first, so a request could be overtaken by later ones and wait longer than it was shown).
        return Placed(min(owned), placement)

    def finished(self, generation_id: str) -> None:
        replica = self.on.pop(generation_id, None)
        if replica is not None and self.loads[replica] > 0:
            self.loads[replica] -= 1

    def _held(self, replicas: Iterable[str]) -> dict[str, Collection[int]]:
        return {r: self.prefixes[r] if r in self.prefixes else self.sent.get(r, OrderedDict()).keys()
                for r in replicas}

    def _sent(self, replica: str, hashes: list[int]) -> None:
        sent = self.sent.setdefault(replica, OrderedDict())
        for h in hashes[CHECKPOINT_BLOCKS - 1::CHECKPOINT_BLOCKS] + hashes[-1:]:
            sent[h] = None
            sent.move_to_end(h)
        while len(sent) > RECENT_PREFIXES:
            sent.popitem(last=False)
