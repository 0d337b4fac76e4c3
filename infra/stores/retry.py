"""Waiting out a store outage in place: the caller keeps its place (its record is not acknowledged, its
offset not committed) and tries the same call again with capped backoff, so nothing is lost or skipped.

Which errors are outages (Cassandra or Redis unreachable, a timeout) is decided here, once; anything
else is the caller's to handle (a poison record goes to the dead-letter topic). This is the one retry policy
for store calls: every stage retries a store through ``until_stored``, never with a loop of its own, so every
wait is seen the same way. ``HEALTH`` says, per stage, which dependency it is waiting for and since when (the
stages process writes it to its health file); ``STORE_WAITS`` and ``STORE_WAIT_SECONDS`` count the retries and
the time spent waiting, per stage and dependency, in the process's metrics.
"""
from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from cassandra import OperationTimedOut, ReadTimeout, Unavailable, WriteTimeout
from cassandra.cluster import NoHostAvailable
from prometheus_client import Counter
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

log = logging.getLogger(__name__)
T = TypeVar("T")

CASSANDRA_DOWN = (NoHostAvailable, OperationTimedOut, Unavailable, ReadTimeout, WriteTimeout)
REDIS_DOWN = (RedisConnectionError, RedisTimeoutError)
STORE_DOWN: tuple[type[BaseException], ...] = (*CASSANDRA_DOWN, *REDIS_DOWN, ConnectionError)
FIRST_DELAY_S, MAX_DELAY_S = 0.2, 5.0
REMIND_EVERY_S = 30.0
STORE_WAITS = Counter("parley_stage_store_waits", "retries of a stage's store call while the store was down",
                      ["stage", "dependency"])
STORE_WAIT_SECONDS = Counter("parley_stage_store_wait_seconds", "time a stage spent waiting for a store that was down",
                             ["stage", "dependency"])


def dependency_of(exc: BaseException) -> str:
    if isinstance(exc, CASSANDRA_DOWN):
        return "Cassandra"
    if isinstance(exc, REDIS_DOWN):
        return "Redis"
    return "a store"


@dataclass
class Health:
    """Per stage: the dependency it is waiting for (and since when), or nothing when healthy."""

    waiting: dict[str, tuple[str, float]] = field(default_factory=dict)
    listeners: list[Callable[[dict[str, tuple[str, float]]], None]] = field(default_factory=list)

    def down(self, stage: str, dependency: str) -> None:
        if self.waiting.get(stage, ("",))[0] != dependency:
            self.waiting[stage] = (dependency, time.time())
            self._changed()

    def up(self, stage: str) -> None:
        if self.waiting.pop(stage, None) is not None:
            self._changed()

    def _changed(self) -> None:
        for listener in self.listeners:
            listener(dict(self.waiting))


HEALTH = Health()


async def until_stored(stage: str, call: Callable[..., Awaitable[T]], *args: Any, first_s: float = FIRST_DELAY_S,
                       max_s: float = MAX_DELAY_S, what: str = "") -> T:
    """``await call(*args)``, retried while a store is down; the wait is logged, shown in ``HEALTH`` and counted
    in ``STORE_WAITS``/``STORE_WAIT_SECONDS``."""
    delay, began, reminded = first_s, 0.0, 0.0
    while True:
        try:
            result = await call(*args)
        except STORE_DOWN as exc:
            dependency, now = dependency_of(exc), time.monotonic()
            if not began:
                began = reminded = now
                log.warning("stage %s waiting for %s (%s)%s; holding its place, retrying every <= %.0f s", stage,
                            dependency, type(exc).__name__, f" at {what}" if what else "", max_s)
            elif now - reminded >= REMIND_EVERY_S:
                reminded = now
                log.warning("stage %s still waiting for %s after %.0f s", stage, dependency, now - began)
            HEALTH.down(stage, dependency)
            STORE_WAITS.labels(stage=stage, dependency=dependency).inc()
            await asyncio.sleep(delay)
            STORE_WAIT_SECONDS.labels(stage=stage, dependency=dependency).inc(delay)
            delay = min(delay * 2, max_s)
            continue
        if began:
            log.info("stage %s: store back after %.1f s; carrying on", stage, time.monotonic() - began)
            HEALTH.up(stage)
        return result
