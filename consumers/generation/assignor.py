"""How a pool's workers share the partitions of ``generate.<pool>.<lane>``: each keeps what it holds.

The scheduler places a conversation on a replica and sends its request to a partition that replica owns
(``consumers/scheduler/replicas.py``), so a partition that moves to another worker takes queued requests, and
the replies a rebalance restarts, away from the cache that holds their prompts. aiokafka's default round-robin
deals every partition out again in member-id order whenever a worker joins or leaves, so most partitions move.

``StickyAssignor`` moves only what must move. Each member says in its join metadata which partitions it holds
now (Kafka's ``user_data``; the consumer's own instance remembers its last assignment, so two consumers in one
process never share that state). The leader then, per topic:

1. gives each claimed partition to its claimant (two claimants, after a member was timed out: the one ranked
   higher for it, by rendezvous hash);
2. caps every member at an even share, ``floor(P/n)`` or ``ceil(P/n)``, the ceiling going first to those
   holding most, so a member sheds only what is over its share;
3. deals the unclaimed and shed partitions to the members under their share, each to the member that ranks it
   highest (rendezvous hashing: a fresh group's deal depends only on the member ids, not on their order).

So a worker joining takes only its share, from those over theirs, and a worker leaving moves only its own
partitions: no partition moves between two workers that both stay. A worker also offers round-robin, second
(``strategies``): Kafka picks a protocol every member offers, so a fleet of workers that offer only round-robin
can be upgraded one at a time, and once none is left the group turns sticky at its next rebalance.

Kafka's rebalance is still eager (aiokafka has no cooperative protocol): every partition is revoked and assigned
again, so replies in flight restart once (``rebalance.py``), but on the worker that held them, with their
prompts in its cache.
"""
from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Iterable, Mapping

from aiokafka.cluster import ClusterMetadata
from aiokafka.coordinator.assignors.roundrobin import RoundRobinPartitionAssignor
from aiokafka.coordinator.protocol import ConsumerProtocolMemberAssignment, ConsumerProtocolMemberMetadata

log = logging.getLogger(__name__)


def rank(member: str, topic: str, partition: int) -> bytes:
    """How much ``member`` wants ``topic``'s ``partition`` (rendezvous hashing: higher wins)."""
    return hashlib.blake2b(f"{member}\0{topic}\0{partition}".encode(), digest_size=8).digest()


def share(topic: str, partitions: Iterable[int], claims: Mapping[str, Iterable[int]]) -> dict[str, list[int]]:
    """The partitions of one topic for each member, given what each claims to hold (pure; see the module)."""
    parts = sorted(set(partitions))
    members = sorted(claims)
    if not members:
        return {}
    owner: dict[int, str] = {}
    for member in members:  # 1. claims kept; a partition claimed twice goes to the claimant ranked higher
        for p in set(claims[member]) & set(parts):
            if p not in owner or rank(member, topic, p) > rank(owner[p], topic, p):
                owner[p] = member
    held = {m: sorted((p for p, o in owner.items() if o == m), key=lambda p: rank(m, topic, p), reverse=True)
            for m in members}
    base, extra = divmod(len(parts), len(members))  # 2. an even share; the ceilings to those holding most
    order = sorted(members, key=lambda m: (-len(held[m]), rank(m, topic, -1)))
    cap = {m: base + (1 if i < extra else 0) for i, m in enumerate(order)}
    loose = [p for p in parts if p not in owner]
    for m in members:
        loose += held[m][cap[m]:]
        held[m] = held[m][:cap[m]]
    wants = sorted(((rank(m, topic, p), m, p) for p in loose for m in members if len(held[m]) < cap[m]),
                   reverse=True)  # 3. the rest to the members under their share, by rank
    dealt: set[int] = set()
    for _, m, p in wants:
        if p not in dealt and len(held[m]) < cap[m]:
            held[m].append(p)
            dealt.add(p)
    return {m: sorted(ps) for m, ps in held.items()}


def _claims(user_data: bytes) -> dict[str, list[int]]:
    try:
        decoded = json.loads(user_data) if user_data else {}
    except ValueError:
        return {}
    if not isinstance(decoded, dict):
        return {}
    return {str(t): [int(p) for p in ps if isinstance(p, int)] for t, ps in decoded.items() if isinstance(ps, list)}


class StickyAssignor:
    """One per consumer (pass the instance in ``partition_assignment_strategy``): it remembers that
    consumer's assignment and claims it at the next join. aiokafka's own assignors are classes with class
    methods, so their state would be shared by every consumer of a process; aiokafka only looks up ``name``
    and calls these three methods, so an instance serves."""

    name = "parley-sticky"
    version = 0

    def __init__(self) -> None:
        self.held: dict[str, list[int]] = {}

    def metadata(self, topics: Iterable[str]) -> ConsumerProtocolMemberMetadata:
        subscribed = sorted(topics)
        claims = {t: ps for t, ps in self.held.items() if t in subscribed}
        return ConsumerProtocolMemberMetadata(self.version, subscribed, json.dumps(claims).encode())

    def on_assignment(self, assignment: ConsumerProtocolMemberAssignment) -> None:
        self.held = {topic: sorted(partitions) for topic, partitions in assignment.assignment}

    def assign(self, cluster: ClusterMetadata, members: Mapping[str, ConsumerProtocolMemberMetadata],
               ) -> dict[str, ConsumerProtocolMemberAssignment]:
        claims = {member: _claims(meta.user_data) for member, meta in members.items()}
        topics = sorted({t for meta in members.values() for t in meta.subscription})
        assignment: dict[str, list[tuple[str, list[int]]]] = {member: [] for member in members}
        for topic in topics:
            partitions = cluster.partitions_for_topic(topic)
            if partitions is None:
                log.warning("no partition metadata for topic %s", topic)
                continue
            subscribed = {m: claims[m].get(topic, []) for m, meta in members.items() if topic in meta.subscription}
            for member, parts in share(topic, partitions, subscribed).items():
                if parts:
                    assignment[member].append((topic, parts))
        return {member: ConsumerProtocolMemberAssignment(self.version, sorted(parts), b"")
                for member, parts in assignment.items()}


def strategies() -> tuple[object, ...]:
    """A generation worker's ``partition_assignment_strategy``: its own sticky assignor, then round-robin."""
    return (StickyAssignor(), RoundRobinPartitionAssignor)
