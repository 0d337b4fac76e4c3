"""Purge stage (group ``purge``): ``ConversationDeleted`` on ``chat.deletions`` -> every row and Redis
key of the conversation removed, then ``ConversationPurged`` on ``audit.purges`` (what, how many, when).

It waits ``purge_delay_s`` after the deletion first: longer than any process keeps a data key
in its cache, so a reply that was finishing as the user deleted cannot write a row after the
purge (its key is gone everywhere by then, and stages skip what they cannot open). Every delete
is by key: a redelivered or restarted purge removes nothing more and produces the same record.
"""
from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from consumers.stage import Out, Stage
from infra.config.settings import Settings
from infra.stores.crypto import DataKeys
from infra.stores.purging import purge
from infra.stores.session import AsyncSession
from schemas import ConversationDeleted, ConversationPurged
from topics import Role, Topics
from topics.catalogue import DEADLETTER, DELETIONS, PURGE, PURGES

log = logging.getLogger(__name__)
ROLE = Role(PURGE, reads=(DELETIONS,), writes=(PURGES, DEADLETTER))


class Purge:
    def __init__(self, db: AsyncSession, data_keys: DataKeys, redis: Any, topics: Topics, delay_s: float) -> None:
        self.db, self.data_keys, self.redis, self.topics, self.delay_s = db, data_keys, redis, topics, delay_s

    async def handle(self, e: ConversationDeleted) -> list[Out]:
        wait = e.at + self.delay_s - time.time()
        if wait > 0:
            await asyncio.sleep(wait)
        began = time.perf_counter()
        removed = await purge(self.db, self.data_keys, self.redis, e.conversation_id, e.user_id, e.generation_ids)
        log.info("conversation %s purged in %.0f ms (%s): %s", e.conversation_id,
                 (time.perf_counter() - began) * 1000, e.reason,
                 ", ".join(f"{n} {what}" for what, n in removed.items()))
        return [Out(self.topics.purges, ConversationPurged(
            conversation_id=e.conversation_id, user_id=e.user_id, reason=e.reason, deleted_at=e.at,
            removed=removed), e.conversation_id)]


def build_stage(settings: Settings, db: AsyncSession, redis: Any, data_keys: DataKeys) -> Stage:
    purger = Purge(db, data_keys, redis, Topics(settings.topic_prefix), settings.purge_delay_s)
    # Keyed by conversation: conversations purge concurrently while each one waits out its delay.
    return Stage(ROLE, settings, (ConversationDeleted,), purger.handle, per_key=True)
