"""Abandoned-reply detector (group ``abandoned``): follows ``chat.tokens``; a reply that is still
generating while no gateway has refreshed its reader heartbeat for ``reader_timeout_s`` gets a
``CancelRequested(reason="abandoned")`` on ``chat.control``, so a user who left does not hold
GPU memory. Generation never waits for a reader; only a reader that is gone for good stops it.
"""
from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

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
from topics import Role, Topics
from topics.catalogue import ABANDONED, CONTROL, TOKENS
from topics.clients import make_consumer, make_producer, send

log = logging.getLogger(__name__)
ROLE = Role(ABANDONED, reads=(TOKENS,), writes=(CONTROL,))


class AbandonedDetector:
    name = ROLE.stage

    def __init__(self, settings: Settings, redis: Any, check_every_s: float = 1.0) -> None:
        self.settings, self.redis, self.check_every_s = settings, redis, check_every_s
        self.topics = Topics(settings.topic_prefix)
        self.running: dict[str, tuple[str, str, float]] = {}  # generation -> (conversation, user, last seen)
        self.consumer = make_consumer(settings.kafka_bootstrap, self.topics.tokens,
                                      group_id=self.topics.group(ABANDONED), auto_offset_reset="latest",
                                      enable_auto_commit=True)
        self.producer = make_producer(settings.kafka_bootstrap)
        self._stopping = asyncio.Event()

    async def run(self) -> None:
        await self.producer.start()
        await self.consumer.start()
        checker = asyncio.create_task(self._check_loop())
        try:
            while not self._stopping.is_set():
                batch = await self.consumer.getmany(timeout_ms=200, max_records=2000)
                for records in batch.values():
                    for record in records:
                        self._observe(record.value)
        finally:
            checker.cancel()
            await self.consumer.stop()
            await self.producer.stop()

    def stop(self) -> None:
        self._stopping.set()

    def _observe(self, value: bytes) -> None:
        try:
            event = decode(value)
        except EventDecodeError:
            return
        if isinstance(event, (GenerationQueued, GenerationStarted)):
            gid = event.generation_id
            if ":" not in gid:  # titles and summaries have no reader by design
                self.running[gid] = (event.conversation_id, event.user_id, time.time())
        elif isinstance(event, (GenerationFinished, RequestRefused)):
            self.running.pop(event.generation_id, None)

    async def _check_loop(self) -> None:
        while True:
            await asyncio.sleep(self.check_every_s)
            await self.check(time.time())

    async def check(self, now: float) -> list[str]:
        cancelled = []
        for gid, (conversation_id, user_id, seen) in list(self.running.items()):
            if now - seen < self.settings.reader_timeout_s or await self.redis.exists(keys.reader_heartbeat(gid)):
                continue
            if await self.redis.set(keys.abandoned_cancelled(gid), "1", nx=True, ex=3600):
                await send(self.producer, self.topics.control, CancelRequested(
                    generation_id=gid, conversation_id=conversation_id, user_id=user_id, reason="abandoned"),
                    key=gid)
                log.info("generation %s abandoned: no reader for %.0f s, cancelled", gid,
                         self.settings.reader_timeout_s)
                cancelled.append(gid)
            self.running.pop(gid, None)
        return cancelled
