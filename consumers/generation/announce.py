"""A generation worker tells the scheduler what it is: every second, the partitions of ``generate.<pool>.*``
Kafka assigned it, how many requests it holds, and (the simulated engine) the prompt prefixes its cache holds.

Written to Redis (``keys.replica``, expiring after ``keys.REPLICA_TTL_S``) with the worker's id in the pool's
set (``keys.replicas``); the scheduler reads them to place a generation on a replica, not just a partition
(``consumers/scheduler/placement.py``). The same round trip renews the worker's alive key, by which the readers
of its generations tell a slow step from a dead worker. Three writes in one pipeline a second per worker;
nothing per token.

A conversation's replica is chosen on a ring of the workers, not of partitions, so Kafka moving partitions in a
rebalance moves no conversation's cache: the next request goes to whichever partition its replica owns now.
Only a worker joining or leaving changes homes, and only its share. The partitions themselves stay put too
(``assignor.py``): a joiner takes its share only from the others, and a leaver's are the only ones to move.
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Collection
from typing import Any

import msgspec
from redis.exceptions import RedisError

from infra.stores import keys

log = logging.getLogger(__name__)
ANNOUNCE_EVERY_S = 1.0


class ReplicaAnnounced(msgspec.Struct, frozen=True, kw_only=True):
    """One worker's announcement: partitions by topic, requests held, and the chain hashes of the prompt
    prefixes its engine holds (None: an engine that does not say, such as vLLM)."""

    worker_id: str
    partitions: dict[str, list[int]]
    active: int
    prefixes: list[int] | None = None
    at: float = 0.0
    # The pool whose engine this worker runs, when it is not the announced pool's own: a worker standing in for a
    # pool with no replica left (consumers/generation/standin.py). "": one of the pool's own replicas.
    stand_in_from: str = ""


def announcement(worker_id: str, assignment: Collection[Any], active: int, engine: Any,
                 now: float | None = None, stand_in_from: str = "") -> ReplicaAnnounced:
    partitions: dict[str, list[int]] = {}
    for tp in sorted(assignment, key=lambda tp: (tp.topic, tp.partition)):
        partitions.setdefault(tp.topic, []).append(tp.partition)
    held = getattr(engine, "held_prefixes", None)
    return ReplicaAnnounced(worker_id=worker_id, partitions=partitions, active=active,
                            prefixes=held() if held is not None else None, at=time.time() if now is None else now,
                            stand_in_from=stand_in_from)


class Announcer:
    def __init__(self, redis: Any, group: str, worker_id: str, consumer: Any, engine: Any,
                 active: Callable[[], int], stand_in_from: str = "") -> None:
        self.redis, self.group, self.worker_id = redis, group, worker_id
        self.consumer, self.engine, self.active = consumer, engine, active
        self.stand_in_from = stand_in_from

    async def once(self) -> None:
        event = announcement(self.worker_id, self.consumer.assignment(), self.active(), self.engine,
                             stand_in_from=self.stand_in_from)
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.set(keys.replica(self.group, self.worker_id), msgspec.json.encode(event), ex=keys.REPLICA_TTL_S)
            pipe.sadd(keys.replicas(self.group), self.worker_id)
            pipe.set(keys.worker_alive(self.worker_id), "1", ex=keys.WORKER_ALIVE_TTL_S)
            await pipe.execute()

    async def run(self) -> None:
        """Beat until cancelled, then withdraw: the scheduler stops placing on this worker at once."""
        try:
            while True:
                # A missed beat: the last one stands until it expires (a reader shows `recovering` early at worst).
                with contextlib.suppress(RedisError):
                    await self.once()
                await asyncio.sleep(ANNOUNCE_EVERY_S)
        finally:
            with contextlib.suppress(RedisError, RuntimeError, ConnectionError):
                await self.redis.delete(keys.replica(self.group, self.worker_id))
                await self.redis.srem(keys.replicas(self.group), self.worker_id)
            log.info("worker %s withdrew its announcement from %s", self.worker_id, self.group)


async def own_replicas(redis: Any, group: str) -> int:
    """How many of a pool's own replicas (not stand-ins) have a live announcement: one set read and one MGET."""
    members = [m.decode() if isinstance(m, bytes) else m for m in await redis.smembers(keys.replicas(group))]
    if not members:
        return 0
    values = await redis.mget([keys.replica(group, m) for m in members])
    return sum(1 for v in values if v is not None and not msgspec.json.decode(v, type=ReplicaAnnounced).stand_in_from)
