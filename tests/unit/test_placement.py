"""Replica placement: consistent hashing with bounded loads, the cache-aware score, and the scheduler's view of
the announced replicas."""
from __future__ import annotations

import random
from collections import Counter

from consumers.generation.announce import ReplicaAnnounced, announcement
from consumers.generation.sim_core import CHECKPOINT_BLOCKS, SimCore, block_hashes
from consumers.scheduler.placement import (
    Ring,
    bounded,
    cache_aware,
    held_share,
    load_cap,
    place,
)
from consumers.scheduler.replicas import Replicas
from infra.config.pools import SimConfig

KEYS = [f"conv-{i}" for i in range(4000)]


def _homes(ring: Ring) -> dict[str, str]:
    return {k: ring.home(k) for k in KEYS}


def test_each_replica_is_home_to_about_its_share() -> None:
    shares = Counter(_homes(Ring([f"w{i}" for i in range(4)])).values())
    assert set(shares) == {"w0", "w1", "w2", "w3"}
    assert max(shares.values()) / min(shares.values()) < 1.6


def test_a_replica_leaving_moves_only_its_own_conversations() -> None:
    before = _homes(Ring(["w0", "w1", "w2", "w3"]))
    after = _homes(Ring(["w0", "w1", "w2"]))
    moved = [k for k in KEYS if before[k] != after[k]]
    assert moved and all(before[k] == "w3" for k in moved)
    assert len(moved) == sum(1 for k in KEYS if before[k] == "w3")


def test_a_replica_joining_takes_only_conversations_that_now_home_on_it() -> None:
    before = _homes(Ring(["w0", "w1", "w2", "w3"]))
    after = _homes(Ring(["w0", "w1", "w2", "w3", "w4"]))
    moved = [k for k in KEYS if before[k] != after[k]]
    assert moved and all(after[k] == "w4" for k in moved)
    assert len(moved) < len(KEYS) / 5 * 1.5  # about its share of 1/5


def test_rings_agree_across_instances_and_orders() -> None:
    a, b = Ring(["w0", "w1", "w2"]), Ring(["w2", "w0", "w1"])
    assert all(a.home(k) == b.home(k) for k in KEYS[:200])
    assert sorted(a.walk("conv-1")) == ["w0", "w1", "w2"]


def test_the_cap_is_c_times_the_mean_with_the_newcomer() -> None:
    assert load_cap({"a": 0, "b": 0, "c": 0, "d": 0}) == 1
    assert load_cap({"a": 10, "b": 10, "c": 10, "d": 9}, c=1.25) == 13  # 1.25 x 40 / 4 = 12.5 -> 13
    assert load_cap({"a": 1, "b": 0}, floor=4) == 4
    assert load_cap({"a": 10, "b": 10, "c": 10, "d": 9}, floor=4) == 13


def test_under_the_floor_the_home_keeps_a_busy_conversation() -> None:
    ring = Ring(["w0", "w1", "w2", "w3"])
    home = ring.home("conv-7")
    loads = {r: 0 for r in ring.replicas} | {home: 3}
    assert bounded(ring, "conv-7", loads).reason == "spill"
    assert bounded(ring, "conv-7", loads, floor=4).replica == home


def test_home_under_the_cap_keeps_the_conversation() -> None:
    ring = Ring(["w0", "w1", "w2", "w3"])
    home = ring.home("conv-7")
    placement = bounded(ring, "conv-7", {r: 5 for r in ring.replicas})
    assert (placement.replica, placement.reason) == (home, "home")


def test_home_at_the_cap_spills_to_the_least_loaded() -> None:
    ring = Ring(["w0", "w1", "w2", "w3"])
    home = ring.home("conv-7")
    loads = {r: 4 for r in ring.replicas} | {home: 9}
    coolest = sorted(set(ring.replicas) - {home})[1]
    loads[coolest] = 1
    placement = bounded(ring, "conv-7", loads)
    assert (placement.replica, placement.reason) == (coolest, "spill")


def test_a_hot_conversation_never_puts_a_replica_past_the_cap() -> None:
    ring = Ring(["w0", "w1", "w2", "w3"])
    loads: Counter[str] = Counter({r: 0 for r in ring.replicas})
    for _ in range(400):  # one conversation, every request still running
        loads[bounded(ring, "hot", loads).replica] += 1
        assert max(loads.values()) <= load_cap({r: loads[r] - (r == max(loads, key=loads.get)) for r in loads}) + 1
    assert max(loads.values()) / (sum(loads.values()) / 4) <= 1.25 + 4 / 400


def test_held_share_is_the_deepest_announced_block() -> None:
    hashes = [11, 12, 13, 14, 15, 16, 17, 18]
    assert held_share(hashes, {14}) == 0.5
    assert held_share(hashes, {12, 18}) == 1.0
    assert held_share(hashes, {99}) == 0.0
    assert held_share([], {1}) == 0.0


def test_cache_aware_prefers_the_replica_holding_the_prompt() -> None:
    ring = Ring(["w0", "w1", "w2", "w3"])
    hashes = list(range(100, 140))
    holder = next(r for r in sorted(ring.replicas) if r != ring.home("conv-1"))
    placement = cache_aware(ring, "conv-1", hashes, {holder: {hashes[-1]}}, {r: 2 for r in ring.replicas})
    assert (placement.replica, placement.reason, placement.held_share) == (holder, "cache", 1.0)


def test_cache_aware_gives_way_to_a_much_shorter_queue() -> None:
    ring = Ring(["w0", "w1", "w2", "w3"])
    hashes = list(range(100, 140))
    holder, other = sorted(ring.replicas)[:2]
    loads = {r: 12 for r in ring.replicas} | {holder: 12, other: 0}
    # the holder holds a tenth of the prompt: 2 x 0.1 - 12/cap loses to the empty queue
    placement = cache_aware(ring, "conv-1", hashes, {holder: {hashes[3]}}, loads)
    assert placement.replica == other


def test_cache_aware_never_picks_a_replica_at_the_cap() -> None:
    ring = Ring(["w0", "w1", "w2", "w3"])
    hashes = list(range(100, 140))
    holder = sorted(ring.replicas)[0]
    loads = {r: 1 for r in ring.replicas} | {holder: 10}
    assert cache_aware(ring, "c", hashes, {holder: set(hashes)}, loads).replica != holder


def test_cache_aware_with_nothing_held_starts_at_the_home() -> None:
    ring = Ring(["w0", "w1", "w2", "w3"])
    placement = cache_aware(ring, "conv-3", [1, 2, 3], {}, {r: 0 for r in ring.replicas})
    assert (placement.replica, placement.reason) == (ring.home("conv-3"), "home")


def test_random_spreads_one_conversation_over_every_replica() -> None:
    ring, rng = Ring(["w0", "w1", "w2", "w3"]), random.Random(1)
    seen = {place("random", ring, "conv-1", {}, rng=rng).replica for _ in range(100)}
    assert seen == set(ring.replicas)


# -- the engine's prefixes ------------------------------------------------------------------------------------
def _core() -> SimCore:
    return SimCore(SimConfig(free_gb=1.0, block_size=4), max_num_seqs=8, max_num_batched_tokens=4096)


def _run(core: SimCore, request_id: str, prompt: list[int], reply: int = 8) -> int:
    seq = core.add(request_id, prompt, list(range(1000, 1000 + reply)), "stop")
    while not core.idle:
        core.step()
    return seq.cached_prompt_tokens


def test_block_hashes_are_the_ones_the_engine_caches_by() -> None:
    core, prompt = _core(), list(range(64))
    _run(core, "a", prompt)
    assert set(block_hashes(prompt, 4)) <= set(core.blocks.by_hash)


def test_the_engine_holds_the_prefix_of_a_finished_prompt() -> None:
    core, prompt = _core(), list(range(40 * CHECKPOINT_BLOCKS))
    _run(core, "a", prompt)
    hashes = block_hashes(prompt + [7] * 12, 4)
    assert held_share(hashes, set(core.held_prefixes())) >= len(prompt) // 4 / len(hashes) - CHECKPOINT_BLOCKS / 40
    assert held_share(block_hashes(list(range(500, 600)), 4), set(core.held_prefixes())) == 0.0


def test_an_evicted_prefix_is_no_longer_announced() -> None:
    core = SimCore(SimConfig(free_gb=0.0001, kv_kb_per_token=1.0, block_size=4), max_num_seqs=8,
                   max_num_batched_tokens=4096)  # 24 blocks
    blocks = core.blocks.num_blocks
    assert blocks == 24
    _run(core, "a", list(range(48)), reply=2)
    first = core.held_prefixes()
    assert first
    _run(core, "b", list(range(10_000, 10_088)), reply=2)  # takes 23 of the 24 blocks
    assert not set(first) & set(core.held_prefixes())


class _TP:
    def __init__(self, topic: str, partition: int) -> None:
        self.topic, self.partition = topic, partition


def test_a_worker_announces_its_partitions_by_topic() -> None:
    event = announcement("w0", [_TP("g.free", 3), _TP("g.paid", 1), _TP("g.free", 0)], 5, object(), now=1.0)
    assert event == ReplicaAnnounced(worker_id="w0", partitions={"g.free": [0, 3], "g.paid": [1]}, active=5,
                                     prefixes=None, at=1.0)


# -- the scheduler's view ---------------------------------------------------------------------------------------
def _announced(*owners: tuple[str, list[int]], prefixes: dict[str, list[int]] | None = None) -> list[ReplicaAnnounced]:
    return [ReplicaAnnounced(worker_id=w, partitions={"g.free": parts}, active=0,
                             prefixes=(prefixes or {}).get(w)) for w, parts in owners]


def test_no_announcement_leaves_the_partition_to_the_fallback() -> None:
    replicas = Replicas("conversation")
    assert replicas.place("g.free", "c", "g1", [1, 2, 3]) is None
    replicas.update(_announced(("w0", [0, 1])))
    assert replicas.place("g.paid", "c", "g1", [1, 2, 3]) is None


def test_a_pool_is_down_once_every_replica_it_had_has_gone() -> None:
    replicas = Replicas("conversation")
    assert not replicas.down  # nothing announced yet: a fleet still loading, its requests wait
    replicas.update([])
    assert not replicas.down
    replicas.update(_announced(("w0", [0]), ("w1", [1])))
    assert not replicas.down
    replicas.update(_announced(("w1", [1])))
    assert not replicas.down
    replicas.update([])
    assert replicas.down
    replicas.update(_announced(("w0", [0])))  # restarted
    assert not replicas.down


def test_a_generation_goes_to_its_replicas_first_partition_so_the_lane_is_taken_in_order() -> None:
    replicas = Replicas("conversation")
    replicas.update(_announced(("w0", [1, 0]), ("w1", [2]), ("w2", [3])))
    used = set()
    for i in range(50):
        placed = replicas.place("g.free", f"c{i}", f"g{i}", [1, 2, 3])
        assert placed is not None
        assert placed.partition == min(replicas.announced[placed.placement.replica].partitions["g.free"])
        used.add(placed.placement.replica)
    assert used == {"w0", "w1", "w2"}  # every replica served, each from one partition (w0 never from 1)
    assert sum(replicas.loads.values()) == 50
    for i in range(50):
        replicas.finished(f"g{i}")
    assert sum(replicas.loads.values()) == 0


def test_follow_up_turns_stay_on_one_replica_and_a_leaver_moves_only_its_share() -> None:
    replicas = Replicas("conversation")
    replicas.update(_announced(*((f"w{i}", [i]) for i in range(4))))
    before = {}
    for i in range(400):
        placed = replicas.place("g.free", f"c{i}", f"g{i}", [1])
        assert placed is not None
        before[f"c{i}"] = placed.placement.replica
        replicas.finished(f"g{i}")
    replicas.update(_announced(*((f"w{i}", [i]) for i in range(3))))
    moved = 0
    for i in range(400):
        placed = replicas.place("g.free", f"c{i}", f"h{i}", [1])
        assert placed is not None
        moved += placed.placement.replica != before[f"c{i}"]
        assert placed.placement.replica == before[f"c{i}"] or before[f"c{i}"] == "w3"
        replicas.finished(f"h{i}")
    assert moved == sum(1 for r in before.values() if r == "w3")


def test_cache_aware_follows_the_announced_prefixes() -> None:
    prompt = list(range(16 * 20))
    hashes = block_hashes(prompt, 16)
    replicas = Replicas("cache-aware")
    replicas.update(_announced(("w0", [0]), ("w1", [1]), prefixes={"w0": [], "w1": [hashes[-1]]}))
    placed = replicas.place("g.free", "c", "g1", prompt)
    assert placed is not None and (placed.placement.replica, placed.partition) == ("w1", 1)


def test_without_announced_prefixes_the_scheduler_remembers_what_it_sent() -> None:
    prompt = list(range(16 * 20))
    replicas = Replicas("cache-aware")
    replicas.update(_announced(("w0", [0]), ("w1", [1]), ("w2", [2])))  # vLLM: no prefixes announced
    first = replicas.place("g.free", "c", "g1", prompt)
    assert first is not None
    replicas.finished("g1")
    other_home = next(f"x{i}" for i in range(100) if Ring(["w0", "w1", "w2"]).home(f"x{i}") != first.placement.replica)
    second = replicas.place("g.free", other_home, "g2", prompt + [5] * 16)
    assert second is not None and second.placement.replica == first.placement.replica
    assert second.placement.reason == "cache"
