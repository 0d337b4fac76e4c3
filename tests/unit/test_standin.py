"""When a worker stands in for a compatible pool: only once none of that pool's own replicas is left (the pool's
own first), only for a pool it has seen served, and only until one of the pool's replicas announces itself
again. The watch loop on a fake Redis and fake workers; the hand-over itself on real Kafka is
tests/integration/test_worker_standin.py."""
from __future__ import annotations

import asyncio

import msgspec
import pytest
from redis.exceptions import ConnectionError as RedisConnectionError

from consumers.generation.announce import ReplicaAnnounced, own_replicas
from consumers.generation.standin import StandIns, standing_in
from infra.stores import keys


@pytest.mark.parametrize(("replicas", "seen", "wanted"), [
    ({"large": 2}, set(), set()),  # served by its own replicas: nothing to do
    ({"large": 0}, {"large"}, {"large"}),  # every own replica gone: stand in
    ({"large": 0}, set(), set()),  # never served here (deployed without workers): left alone
    ({"large": 1}, {"large"}, set()),  # one of its own is back: it takes over again
    ({"large": 0, "tiny": 0}, {"large", "tiny"}, {"large", "tiny"}),
])
def test_a_pool_is_stood_in_for_only_when_it_had_replicas_and_has_none_left(
        replicas: dict[str, int], seen: set[str], wanted: set[str]) -> None:
    now, served = standing_in(sorted(replicas), replicas, seen)
    assert now == wanted
    assert served == seen | {p for p, n in replicas.items() if n}


class Announcements:
    """The two Redis reads of ``own_replicas``: a pool's member set and their announcements."""

    def __init__(self) -> None:
        self.members: dict[str, dict[str, bytes]] = {}
        self.down = False

    def announce(self, group: str, worker_id: str, stand_in_from: str = "") -> None:
        event = ReplicaAnnounced(worker_id=worker_id, partitions={}, active=0, stand_in_from=stand_in_from)
        self.members.setdefault(group, {})[worker_id] = msgspec.json.encode(event)

    def expire(self, group: str, worker_id: str) -> None:
        self.members[group][worker_id] = None  # type: ignore[assignment]  # still in the set, its key gone

    async def smembers(self, key: str) -> set[bytes]:
        if self.down:
            raise RedisConnectionError("down")
        return {w.encode() for g, ws in self.members.items() if keys.replicas(g) == key for w in ws}

    async def mget(self, names: list[str]) -> list[bytes | None]:
        found = {keys.replica(g, w): v for g, ws in self.members.items() for w, v in ws.items()}
        return [found.get(n) for n in names]


async def test_own_replicas_counts_the_pools_own_live_announcements_not_stand_ins() -> None:
    redis = Announcements()
    redis.announce("g-large", "large-1")
    redis.announce("g-large", "large-2")
    redis.announce("g-large", "small-1+large", stand_in_from="small")
    assert await own_replicas(redis, "g-large") == 2
    redis.expire("g-large", "large-2")
    assert await own_replicas(redis, "g-large") == 1
    assert await own_replicas(redis, "g-tiny") == 0


class FakeWorker:
    def __init__(self, pool: str) -> None:
        self.worker_id, self.engine_failure = f"small-1+{pool}", None
        self.stopping, self.stopped = asyncio.Event(), False

    async def run(self) -> None:
        await self.stopping.wait()
        self.stopped = True

    def stop(self) -> None:
        self.stopping.set()


async def test_the_watch_starts_a_stand_in_when_the_last_replica_goes_and_stops_it_when_one_returns() -> None:
    redis, made, dead = Announcements(), [], []  # type: ignore[var-annotated]

    def make(pool: str) -> FakeWorker:
        made.append(FakeWorker(pool))
        return made[-1]

    watch = StandIns(redis, {"large": "g-large"}, make, dead.append)
    redis.announce("g-large", "large-1")
    await watch.once()
    assert made == [] and watch.seen == {"large"}  # served by its own replica

    redis.expire("g-large", "large-1")  # killed: its announcement expired
    await watch.once()
    assert list(watch.running) == ["large"] and len(made) == 1
    redis.announce("g-large", made[0].worker_id, stand_in_from="small")  # the stand-in's own announcement
    await watch.once()
    assert len(made) == 1  # one stand-in, which does not count as the pool's own replica

    redis.down = True
    await watch.once()  # Redis unreachable: nothing known, the stand-in keeps going
    assert list(watch.running) == ["large"] and not made[0].stopped
    redis.down = False

    redis.announce("g-large", "large-1")  # restarted, its engine loaded, in the group again
    await watch.once()
    assert watch.running == {} and made[0].stopped  # handed back: stopped, its group left
    assert dead == []


async def test_a_stand_ins_dead_engine_is_the_workers_and_a_cancelled_watch_stops_its_stand_ins() -> None:
    redis, made, dead = Announcements(), [], []  # type: ignore[var-annotated]

    def make(pool: str) -> FakeWorker:
        made.append(FakeWorker(pool))
        return made[-1]

    watch = StandIns(redis, {"large": "g-large"}, make, dead.append)
    watch.seen = frozenset({"large"})
    await watch.once()
    made[0].engine_failure = "engine gone"  # type: ignore[assignment]
    made[0].stop()
    await asyncio.sleep(0)
    await watch.once()  # reaped: the engine is this worker's too, so the worker is told
    assert dead == ["engine gone"]
    assert len(made) == 2  # still wanted: started again (the worker itself exits on the dead engine)

    task = asyncio.create_task(watch.run())
    await asyncio.sleep(0.05)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    assert made[-1].stopped and watch.running == {}
