"""Abandoned-reply detector (group ``abandoned``): follows ``chat.tokens``; a reply that is still
generating while no gateway has refreshed its reader heartbeat for ``reader_timeout_s`` gets a
``CancelRequested(reason="abandoned")`` on ``chat.control``, so a user who left does not hold
GPU memory. Generation never waits for a reader; only a reader that is gone for good stops it.
"""
from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Coroutine
from typing import Any

from aiokafka.errors import KafkaError
from redis.exceptions import RedisError

from infra.config.settings import Settings
from infra.stores import keys
from schemas import (
    CancelRequested,
    EventDecodeError,
    GenerationFinished,
    GenerationQueued,
    GenerationStarted,
    RequestRefused,
    decode,
)
from schemas.base import Event
from topics import Role, Topics
from topics.catalogue import ABANDONED, CONTROL, TOKENS
from topics.clients import make_consumer, make_producer, send
from topics.runner import Runner

log = logging.getLogger(__name__)
ROLE = Role(ABANDONED, reads=(TOKENS,), writes=(CONTROL,))


Running = dict[str, tuple[str, str, float]]  # generation -> (conversation, user, when it was last seen starting)


def observe(running: Running, event: Event, now: float) -> None:
    """Follow one token-buffer event: a reply starts being watched when queued or started, and stops when it
    finishes or is refused. Titles and summaries (ids with a ``:``) have no reader by design."""
    if isinstance(event, (GenerationQueued, GenerationStarted)):
        if ":" not in event.generation_id:
            running[event.generation_id] = (event.conversation_id, event.user_id, now)
    elif isinstance(event, (GenerationFinished, RequestRefused)):
        running.pop(event.generation_id, None)


def overdue(running: Running, now: float, timeout_s: float) -> list[str]:
    """The watched replies seen for longer than ``timeout_s``: the ones whose reader heartbeat to check."""
    return [gid for gid, (_, _, seen) in running.items() if now - seen >= timeout_s]


class AbandonedDetector(Runner):
    name = ROLE.stage

    def __init__(self, settings: Settings, redis: Any, check_every_s: float = 1.0) -> None:
        super().__init__()
        self.settings, self.redis, self.check_every_s = settings, redis, check_every_s
        self.topics = Topics(settings.topic_prefix)
        self.running: Running = {}
        self.consumer = make_consumer(settings.kafka_bootstrap, self.topics.tokens,
                                      group_id=self.topics.group(ABANDONED), auto_offset_reset="latest",
                                      enable_auto_commit=True)
        self.producer = make_producer(settings.kafka_bootstrap)

    def clients(self) -> list[Any]:
        return [self.producer, self.consumer]

    def background(self) -> list[Coroutine[Any, Any, None]]:
        return [self._check_loop()]

    async def step(self) -> None:
        batch = await self.consumer.getmany(timeout_ms=200, max_records=2000)
        now = time.time()
        for records in batch.values():
            for record in records:
                try:
                    observe(self.running, decode(record.value), now)
                except EventDecodeError:
                    continue  # the token buffer's producers dead-letter; a follower only skips

    async def _check_loop(self) -> None:
        while True:
            await asyncio.sleep(self.check_every_s)
            try:
                await self.check(time.time())
            except (RedisError, KafkaError) as exc:  # a store outage: the replies stay watched, checked again
                log.warning("abandoned-reply check waits for its stores (%s); %d replies watched",
                            type(exc).__name__, len(self.running))

    async def check(self, now: float) -> list[str]:
        """Cancel each overdue reply nobody reads (once, across restarts: a Redis marker); the cancelled ids.
        A reply stays watched until its cancel is sent, so a store error only delays it."""
        cancelled = []
        for gid in overdue(self.running, now, self.settings.reader_timeout_s):
            if await self.redis.exists(keys.reader_heartbeat(gid)):
                continue  # a gateway is still reading it
            watched = self.running.get(gid)
            if watched is None:
                continue  # it ended while the heartbeat was looked up
            conversation_id, user_id, _ = watched
            marker = keys.abandoned_cancelled(gid)
            if await self.redis.set(marker, "1", nx=True, ex=3600):
                try:
                    await send(self.producer, self.topics.control, CancelRequested(
                        generation_id=gid, conversation_id=conversation_id, user_id=user_id, reason="abandoned"),
                        key=gid)
                except BaseException:
                    await self.redis.delete(marker)  # not sent: the next check tries again
                    raise
                log.info("generation %s abandoned: no reader for %.0f s, cancelled", gid,
                         self.settings.reader_timeout_s)
                cancelled.append(gid)
            self.running.pop(gid, None)
        return cancelled
