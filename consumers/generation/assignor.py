"""How a pool's workers share the partitions of ``generate.<pool>.<lane>``: each keeps what it holds.

The scheduler places a conversation on a replica and sends its request to a partition that replica owns
(``consumers/scheduler/replicas.py``), so a partition that moves to another worker takes queued requests, and
the replies a rebalance restarts, away from the cache that holds their prompts. aiokafka's default round-robin
deals every partition out again in member-id order whenever a worker joins or leaves, so most partitions move.

``StickyAssignor`` moves only what must move. The leader deals each partition to the worker that held it in the
group's last assignment, which every member keeps: the leader writes the whole assignment, by worker id, into each
member's assignment (Kafka's assignment ``user_data``), so whichever member leads the next rebalance knows it. A
member's join metadata carries only its worker id, which never changes: Kafka starts another rebalance whenever a
member joins with metadata other than it joined with last (a member that put the partitions it holds there, as
Kafka's own sticky assignors do, changed it with every assignment, and two workers rejoining after each sync kept the
group rebalancing without end). The leader then, per topic:

1. gives each partition to the worker that held it (two members claiming one, after a worker restarted under its
   old id: the one ranked higher for it, by rendezvous hash);
2. caps every member at an even share, ``floor(P/n)`` or ``ceil(P/n)``, the ceiling going first to those
   holding most, so a member sheds only what is over its share;
3. deals the unclaimed and shed partitions to the members under their share, each to the member that ranks it
   highest (rendezvous hashing on the worker ids: a fresh group's deal depends only on who is in it).

So a worker joining takes only its share, from those over theirs, and a worker leaving moves only its own
partitions: no partition moves between two workers that both stay.

A worker offers this one protocol and no other. aiokafka 0.14 sends one JoinGroup per protocol offered, the
first naming only the first protocol, the next the first two (aio-libs/aiokafka#1168), so a member offering two
changed its metadata within every join and kept its group rebalancing. A group whose workers offer only
round-robin (Parley before this assignor) refuses a worker offering only this one (Kafka's
``InconsistentGroupProtocol``; the worker exits and its supervisor retries): restart a pool's workers together.

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


def _decoded(user_data: bytes) -> object:
    try:
        return json.loads(user_data) if user_data else None
    except ValueError:
        return None


def _worker(member: str, meta: ConsumerProtocolMemberMetadata) -> str:
    """The worker id a member joined with (its member id when it named none)."""
    decoded = _decoded(meta.user_data)
    worker = decoded.get("worker") if isinstance(decoded, dict) else None
    return worker if isinstance(worker, str) and worker else member


def _last(user_data: bytes) -> dict[str, dict[str, list[int]]]:
    """The group's last assignment as the leader wrote it: worker id -> topic -> partitions; {} when unreadable."""
    decoded = _decoded(user_data)
    if not isinstance(decoded, dict):
        return {}
    return {str(w): {str(t): [p for p in ps if isinstance(p, int)] for t, ps in topics.items() if isinstance(ps, list)}
            for w, topics in decoded.items() if isinstance(topics, dict)}


class StickyAssignor:
    """One per consumer (pass the instance in ``partition_assignment_strategy``): it remembers the group's last
    assignment as its member was told it. aiokafka's own assignors are classes with class methods, so their
    state would be shared by every consumer of a process; aiokafka only looks up ``name`` and calls these three
    methods, so an instance serves."""

    name = "parley-sticky"
    version = 1

    def __init__(self, worker_id: str) -> None:
        self.worker_id = worker_id
        self.last: dict[str, dict[str, list[int]]] = {}  # worker id -> topic -> partitions, the whole group's
        self.held: dict[str, list[int]] = {}  # this member's own

    def metadata(self, topics: Iterable[str]) -> ConsumerProtocolMemberMetadata:
        """The same bytes at every join of this worker (see the module)."""
        return ConsumerProtocolMemberMetadata(self.version, sorted(topics),
                                              json.dumps({"worker": self.worker_id}).encode())

    def on_assignment(self, assignment: ConsumerProtocolMemberAssignment) -> None:
        self.held = {topic: sorted(partitions) for topic, partitions in assignment.assignment}
        self.last = _last(assignment.user_data)

    def assign(self, cluster: ClusterMetadata, members: Mapping[str, ConsumerProtocolMemberMetadata],
               ) -> dict[str, ConsumerProtocolMemberAssignment]:
        workers = {member: _worker(member, meta) for member, meta in members.items()}
        topics = sorted({t for meta in members.values() for t in meta.subscription})
        assignment: dict[str, list[tuple[str, list[int]]]] = {member: [] for member in members}
        for topic in topics:
            partitions = cluster.partitions_for_topic(topic)
            if partitions is None:
                log.warning("no partition metadata for topic %s", topic)
                continue
            # Claims and ranks by worker id, so a deal does not depend on the member ids Kafka makes up per join
            # (two members under one id, an old instance not timed out yet beside its restart: told apart).
            subscribed = [m for m, meta in members.items() if topic in meta.subscription]
            twice = {w for w in (workers[m] for m in subscribed) if sum(workers[o] == w for o in subscribed) > 1}
            named = {workers[m] if workers[m] not in twice else f"{workers[m]}\0{m}": m for m in subscribed}
            claims = {key: self.last.get(workers[m], {}).get(topic, []) for key, m in named.items()}
            for key, parts in share(topic, partitions, claims).items():
                if parts:
                    assignment[named[key]].append((topic, parts))
        whole: dict[str, dict[str, list[int]]] = {}
        for member, dealt in assignment.items():
            for topic, held in dealt:
                whole.setdefault(workers[member], {}).setdefault(topic, []).extend(held)
        told = json.dumps(whole, sort_keys=True).encode()
        return {member: ConsumerProtocolMemberAssignment(self.version, sorted(parts), told)
                for member, parts in assignment.items()}


def strategies(worker_id: str) -> tuple[object, ...]:
    """A generation worker's ``partition_assignment_strategy``: its own sticky assignor, alone (see the module)."""
    return (StickyAssignor(worker_id),)
