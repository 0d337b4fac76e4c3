"""A worker stands in for a pool none of whose own replicas is left.

A pool may name others ``compatible`` in pools.toml (same model, same tokenizer, a context at least as long;
checked when the pools are read). Each worker of a pool so named reads, once a second, how many of that pool's
own replicas have a live announcement (``consumers/generation/announce.py``, gone REPLICA_TTL_S after the last
beat). When a pool it has seen served has none left (its workers killed, or reloading their engines), the worker
starts a second ``GenerationWorker`` on its own engine in that pool's consumer group: Kafka hands it the pool's
partitions, and it resumes each unfinished reply from its saved tokens under a newer epoch and takes the pool's
new requests, as one of the pool's replicas would. As soon as one of the pool's own replicas announces itself
again, the stand-in stops; the replies it held stay uncommitted and the pool's replica resumes them the same way.
The pool's own replicas come first: while one is alive, the group's rebalance gives it the dead one's partitions.

A pool never seen served here (one deployed without workers) is not stood in for. A stand-in's replies name the
pool they were asked of and the stand-in's worker id (``<worker>+<pool>``); its metrics are not served. It costs
one Redis set read and one MGET a second per pool this worker may stand in for; nothing per token.
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Any

from redis.exceptions import RedisError

from consumers.generation.announce import own_replicas

log = logging.getLogger(__name__)
WATCH_EVERY_S = 1.0
STOP_WITHIN_S = 60.0  # a stand-in's shutdown: its replies cancelled, its offsets committed, the group left


def standing_in(candidates: Collection[str], replicas: Mapping[str, int],
                seen: Collection[str]) -> tuple[frozenset[str], frozenset[str]]:
    """The pools to stand in for now, and the pools seen served so far. ``replicas``: each candidate's own
    replicas with a live announcement. A candidate is stood in for when it has none and had one before."""
    served = frozenset(seen) | {p for p in candidates if replicas.get(p, 0) > 0}
    return frozenset(p for p in candidates if p in served and replicas.get(p, 0) == 0), served


@dataclass
class _Running:
    worker: Any  # GenerationWorker
    task: asyncio.Task[None]


class StandIns:
    """Watches the pools this worker's pool is compatible with and runs a stand-in for each that needs one.

    ``groups``: pool -> its consumer group; ``make``: a GenerationWorker for a pool, on this worker's engine;
    ``engine_dead``: called with the stand-in's engine failure (the engine is this worker's too)."""

    def __init__(self, redis: Any, groups: Mapping[str, str], make: Callable[[str], Any],
                 engine_dead: Callable[[Any], None]) -> None:
        self.redis, self.groups, self.make, self.engine_dead = redis, dict(groups), make, engine_dead
        self.running: dict[str, _Running] = {}
        self.seen: frozenset[str] = frozenset()

    async def run(self) -> None:
        """Watch until cancelled, then stop every stand-in."""
        try:
            while True:
                await self.once()
                await asyncio.sleep(WATCH_EVERY_S)
        finally:
            for pool in list(self.running):
                await self._stop(pool)

    async def once(self) -> None:
        self._reap()
        try:
            replicas = {pool: await own_replicas(self.redis, group) for pool, group in self.groups.items()}
        except RedisError as exc:  # nothing known this round: keep what runs
            log.info("stand-in watch: replicas not read (%s)", type(exc).__name__)
            return
        wanted, self.seen = standing_in(self.groups, replicas, self.seen)
        for pool in sorted(set(self.running) - wanted):
            log.info("pool %s has a replica of its own again: its stand-in stops", pool)
            await self._stop(pool)
        for pool in sorted(wanted - set(self.running)):
            worker = self.make(pool)
            log.warning("pool %s has no replica left: worker %s stands in, resuming its replies from their "
                        "saved tokens", pool, worker.worker_id)
            self.running[pool] = _Running(worker, asyncio.create_task(worker.run(), name=f"stand-in {pool}"))

    def _reap(self) -> None:
        """A stand-in that ended by itself: its engine died (this worker's too), or it failed and is started
        again on the next round if still wanted."""
        for pool, run in list(self.running.items()):
            if not run.task.done():
                continue
            del self.running[pool]
            if run.worker.engine_failure is not None:
                self.engine_dead(run.worker.engine_failure)
            elif not run.task.cancelled() and run.task.exception() is not None:
                log.error("stand-in for pool %s ended: %r", pool, run.task.exception())

    async def _stop(self, pool: str) -> None:
        run = self.running.pop(pool)
        run.worker.stop()
        with contextlib.suppress(Exception):  # a timeout, or the failure _reap would have logged
            await asyncio.wait_for(asyncio.shield(run.task), STOP_WITHIN_S)
        if not run.task.done():
            run.task.cancel()
