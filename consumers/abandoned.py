"""Abandoned-reply detector (stage ``abandoned``): reads no topic. Once a second it looks in Redis at the
replies that hold a reservation (``reservations_by_expiry``: admission adds a reply as it reserves, settlement
or a release removes it when the reply ends or is refused) and were admitted at least ``reader_timeout_s``
ago; one whose reader heartbeat no gateway has refreshed for ``reader_timeout_s`` gets a
``CancelRequested(reason="abandoned")`` on ``chat.control``, so a user who left does not hold GPU memory.
Generation never waits for a reader; only a reader that is gone for good stops it.

It costs one sorted-set range and one pipelined lookup per check, whatever the token rate: it never reads
``chat.tokens``. A reply that has ended but is not settled yet (``finished_reply`` is written before its end
is published) is left alone, as is the service's own call for a title or summary (an id with a ``:``).
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

from aiokafka.errors import KafkaError
from redis.exceptions import RedisError

from infra.config.settings import Settings
from infra.stores import keys
from schemas import CancelRequested
from topics import Role, Topics
from topics.catalogue import ABANDONED, CONTROL
from topics.clients import make_producer, send
from topics.runner import Runner

log = logging.getLogger(__name__)
ROLE = Role(ABANDONED, reads=(), writes=(CONTROL,))


@dataclass(frozen=True)
class Watched:
    """One reply admitted long enough ago to be checked, and what Redis says about it now."""

    generation_id: str
    conversation_id: str
    user_id: str
    read: bool  # a reader heartbeat is present
    ended: bool  # its finish is written (settlement has not removed it yet)
    cancelled: bool  # a detector cancelled it already


def oldest_admission(now: float, timeout_s: float, reservation_ttl_s: float) -> float:
    """The highest reservation expiry of a reply admitted ``timeout_s`` or more before ``now``."""
    return now - timeout_s + reservation_ttl_s


def abandoned(watched: list[Watched]) -> list[Watched]:
    """Pure: the replies to cancel. A reply with a reader is never among them."""
    return [w for w in watched if not (w.read or w.ended or w.cancelled or ":" in w.generation_id)]


class AbandonedDetector(Runner):
    name = ROLE.stage

    def __init__(self, settings: Settings, redis: Any, check_every_s: float = 1.0) -> None:
        super().__init__()
        self.settings, self.redis, self.check_every_s = settings, redis, check_every_s
        self.topics = Topics(settings.topic_prefix)
        self.running_key = keys.reservations_by_expiry(settings.topic_prefix)
        self.producer = make_producer(settings.kafka_bootstrap)

    def clients(self) -> list[Any]:
        return [self.producer]

    async def step(self) -> None:
        await self.idle(self.check_every_s)
        if self.stopping:
            return
        try:
            await self.check(time.time())
        except (RedisError, KafkaError) as exc:  # a store outage: the replies are checked again next time
            log.warning("abandoned-reply check waits for its stores (%s)", type(exc).__name__)

    async def watched(self, now: float) -> list[Watched]:
        """The replies admitted at least ``reader_timeout_s`` ago and not yet settled, looked up in one
        round trip (a range of the reservations' sorted set, then one pipeline)."""
        s = self.settings
        last = oldest_admission(now, s.reader_timeout_s, s.reservation_ttl_s)
        gids = [g.decode() if isinstance(g, bytes) else g
                for g in await self.redis.zrangebyscore(self.running_key, "-inf", last)]
        gids = [g for g in gids if ":" not in g]
        if not gids:
            return []
        async with self.redis.pipeline(transaction=False) as pipe:
            for gid in gids:
                pipe.hmget(keys.reservation(gid), "conversation_id", "user_id")
                pipe.exists(keys.reader_heartbeat(gid))
                pipe.exists(keys.finished_reply(gid))
                pipe.exists(keys.abandoned_cancelled(gid))
            found = await pipe.execute()
        return [_watched(gid, *found[4 * i:4 * i + 4]) for i, gid in enumerate(gids)]

    async def check(self, now: float) -> list[str]:
        """Cancel each overdue reply nobody reads (once, across restarts: a Redis marker); the cancelled ids.
        A store error only delays a cancel: the marker is taken back when the cancel could not be sent."""
        cancelled = []
        for w in abandoned(await self.watched(now)):
            marker = keys.abandoned_cancelled(w.generation_id)
            if not await self.redis.set(marker, "1", nx=True, ex=3600):
                continue  # another detector was first
            try:
                await send(self.producer, self.topics.control, CancelRequested(
                    generation_id=w.generation_id, conversation_id=w.conversation_id, user_id=w.user_id,
                    reason="abandoned"), key=w.generation_id)
            except BaseException:
                await self.redis.delete(marker)  # not sent: the next check tries again
                raise
            log.info("generation %s abandoned: no reader for %.0f s, cancelled", w.generation_id,
                     self.settings.reader_timeout_s)
            cancelled.append(w.generation_id)
        return cancelled


def _watched(gid: str, ids: list[Any], read: int, ended: int, cancelled: int) -> Watched:
    conversation_id, user_id = (_text(v) for v in ids)
    return Watched(gid, conversation_id, user_id, bool(read), bool(ended), bool(cancelled))


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else (value or "")
