"""The generation workers' assignor: an even share, and no partition moves between two workers that both stay."""
from __future__ import annotations

import random
import uuid

from aiokafka.cluster import ClusterMetadata
from aiokafka.coordinator.protocol import ConsumerProtocolMemberAssignment
from aiokafka.structs import TopicPartition

from consumers.generation.assignor import StickyAssignor, share

TOPICS = ("generate.large.paid", "generate.large.free")


def _members(n: int, rng: random.Random) -> list[str]:
    return [f"worker-{uuid.UUID(int=rng.getrandbits(128))}" for _ in range(n)]


def _deal(members: list[str], partitions: int, held: dict[str, list[int]] | None = None) -> dict[str, list[int]]:
    claims = {m: (held or {}).get(m, []) for m in members}
    return share(TOPICS[0], range(partitions), claims)


def _even(dealt: dict[str, list[int]], partitions: int) -> None:
    counts = [len(ps) for ps in dealt.values()]
    assert sorted(p for ps in dealt.values() for p in ps) == list(range(partitions))  # each exactly once
    assert max(counts) - min(counts) <= 1


def test_a_fresh_group_gets_an_even_deal_that_depends_only_on_who_is_in_it() -> None:
    rng = random.Random(1)
    for n, partitions in ((1, 4), (2, 4), (3, 4), (4, 4), (6, 4), (3, 16)):
        members = _members(n, rng)
        dealt = _deal(members, partitions)
        _even(dealt, partitions)
        assert _deal(list(reversed(members)), partitions) == dealt


def test_a_worker_joining_takes_only_its_share_and_nothing_moves_between_the_others() -> None:
    rng = random.Random(2)
    for _ in range(400):
        partitions, n = rng.choice((4, 8, 16)), rng.randint(1, 6)
        members = _members(n, rng)
        before = _deal(members, partitions)
        joiner = _members(1, rng)[0]
        after = _deal([*members, joiner], partitions, before)
        _even(after, partitions)
        for m in members:
            assert set(after[m]) <= set(before[m]), (partitions, n, before, after)
        assert len(after[joiner]) >= partitions // (n + 1)


def test_a_worker_leaving_moves_only_its_own_partitions() -> None:
    rng = random.Random(3)
    for _ in range(400):
        partitions, n = rng.choice((4, 8, 16)), rng.randint(2, 6)
        members = _members(n, rng)
        before = _deal(members, partitions)
        leaver = rng.choice(members)
        stay = [m for m in members if m != leaver]
        after = _deal(stay, partitions, before)
        _even(after, partitions)
        for m in stay:
            assert set(before[m]) <= set(after[m]), (partitions, n, before, after)


def test_claims_that_clash_or_name_no_partition_still_give_each_partition_once() -> None:
    dealt = share(TOPICS[0], range(4), {"a": [0, 1, 2, 3, 9], "b": [0, 1], "c": [7]})
    _even(dealt, 4)


class _Cluster(ClusterMetadata):
    def partitions_for_topic(self, topic: str) -> set[int] | None:
        return set(range(4)) if topic in TOPICS else None


def test_through_aiokafkas_protocol_any_member_leads_the_next_deal_sticky() -> None:
    """Every member is told the whole assignment, so the next leader keeps it, whichever member that is."""
    a, b, c = StickyAssignor("w-a"), StickyAssignor("w-b"), StickyAssignor("w-c")
    cluster = _Cluster()
    first = a.assign(cluster, {"m-a": a.metadata(TOPICS), "m-b": b.metadata(TOPICS)})
    a.on_assignment(first["m-a"])
    b.on_assignment(first["m-b"])
    assert {tp for m in first.values() for tp in m.partitions()} == {TopicPartition(t, p) for t in TOPICS
                                                                     for p in range(4)}
    assert b.last == a.last and set(b.last) == {"w-a", "w-b"}
    # b leads this time, under new member ids (Kafka makes them up per session)
    second = b.assign(cluster, {"n-a": a.metadata(TOPICS), "n-b": b.metadata(TOPICS), "n-c": c.metadata(TOPICS)})
    for member, old in (("n-a", first["m-a"]), ("n-b", first["m-b"])):
        assert set(second[member].partitions()) <= set(old.partitions())
    assert len(second["n-c"].partitions()) >= 2  # one of each lane at least
    assert isinstance(second["n-c"], ConsumerProtocolMemberAssignment)
    c.on_assignment(second["n-c"])
    assert c.held == {t: ps for t, ps in second["n-c"].assignment}
    # and c, which was never told the first deal, leads after a leaves: b and c keep all they had
    third = c.assign(cluster, {"o-b": b.metadata(TOPICS), "o-c": c.metadata(TOPICS)})
    assert set(second["n-b"].partitions()) <= set(third["o-b"].partitions())
    assert set(second["n-c"].partitions()) <= set(third["o-c"].partitions())


def test_a_members_join_metadata_never_changes() -> None:
    """Kafka rebalances again whenever a member rejoins with other metadata than it joined with last: a worker's
    metadata is the same before and after any assignment (it was not, and the group rebalanced without end)."""
    a, b = StickyAssignor("w-a"), StickyAssignor("w-b")
    before = a.metadata(TOPICS).encode()
    dealt = a.assign(_Cluster(), {"m-a": a.metadata(TOPICS), "m-b": b.metadata(TOPICS)})
    a.on_assignment(dealt["m-a"])
    assert a.held and a.metadata(TOPICS).encode() == before


def test_garbage_user_data_is_an_unnamed_member_with_no_claim() -> None:
    from aiokafka.coordinator.protocol import ConsumerProtocolMemberMetadata

    assignor = StickyAssignor("w-a")
    dealt = assignor.assign(_Cluster(), {
        "x": ConsumerProtocolMemberMetadata(0, list(TOPICS), b"not json"),
        "y": ConsumerProtocolMemberMetadata(0, list(TOPICS), b"[1, 2]")})
    assert sum(len(a.partitions()) for a in dealt.values()) == 8
    assignor.on_assignment(ConsumerProtocolMemberAssignment(1, [], b"\xff{"))
    assert assignor.last == {}


def test_two_members_under_one_worker_id_still_get_each_partition_once() -> None:
    """A worker restarted under its old id while its old instance is not timed out yet: both claim its share."""
    a, b = StickyAssignor("w-a"), StickyAssignor("w-b")
    first = a.assign(_Cluster(), {"m-a": a.metadata(TOPICS), "m-b": b.metadata(TOPICS)})
    a.on_assignment(first["m-a"])
    again = StickyAssignor("w-a")
    dealt = a.assign(_Cluster(), {"m-a": a.metadata(TOPICS), "m-a2": again.metadata(TOPICS),
                                  "m-b": b.metadata(TOPICS)})
    assert sorted(tp for m in dealt.values() for tp in m.partitions()) == sorted(
        TopicPartition(t, p) for t in TOPICS for p in range(4))
    assert set(dealt["m-b"].partitions()) <= set(first["m-b"].partitions())


def test_round_robin_before_it_moved_partitions_between_workers_that_stayed() -> None:
    # The baseline the docs quote: aiokafka's round-robin over the same join, 2 workers -> 3, two lanes of 4.
    from aiokafka.coordinator.assignors.roundrobin import RoundRobinPartitionAssignor
    from aiokafka.coordinator.protocol import ConsumerProtocolMemberMetadata

    rng, cluster, moved = random.Random(4), _Cluster(), []
    for _ in range(200):
        members = _members(3, rng)
        meta = {m: ConsumerProtocolMemberMetadata(0, list(TOPICS), b"") for m in members}
        before = RoundRobinPartitionAssignor.assign(cluster, {m: meta[m] for m in members[:2]})
        after = RoundRobinPartitionAssignor.assign(cluster, meta)
        owner = {tp: m for m, a in after.items() for tp in a.partitions()}
        moved.append(sum(owner[tp] not in (m, members[2]) for m in members[:2] for tp in before[m].partitions()))
    assert min(moved) >= 2 and max(moved) <= 3  # of 8, every time; the sticky assignor: none
