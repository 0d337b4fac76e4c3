"""The routing benchmark's join and leave, small: with conversation affinity a replica joining takes at most its
share of the running conversations and a leaving one moves only its own; random placement moves most."""
from __future__ import annotations

from tests.benchmarks.bench_routing import simulate


def test_a_joining_replica_takes_at_most_its_share_and_the_others_keep_theirs() -> None:
    for routing in ("conversation", "cache-aware"):
        run = simulate(routing, rate=1.5, seconds=40, seed=3, join_at=20)
        turns = run.to_joiner + run.stayed + run.between
        assert turns > 50
        assert run.to_joiner <= turns / 4 and run.between <= turns / 10, (routing, run.to_joiner, run.between, turns)
    rand = simulate("random", rate=1.5, seconds=40, seed=3, join_at=20)
    assert rand.between > (rand.to_joiner + rand.stayed + rand.between) / 3  # the baseline does move them


def test_a_leaving_replica_moves_only_its_own_conversations() -> None:
    run = simulate("conversation", rate=1.5, seconds=40, seed=3, leave_at=20)
    assert run.others > 50 and run.kept >= run.others * 0.9, (run.kept, run.others)
