"""Retention sweeper (in the stages process): every ``retention_sweep_s``, conversations whose owner's
plan sets ``retention_days`` and that have been idle longer than that are deleted by the same path
as a user's delete: hidden, data key destroyed, replies cancelled, ``ConversationDeleted`` on
``chat.deletions`` for the purge stage.

The sweep pages through the ``conversations`` table. That is fine for one node's worth of
conversations; a large deployment would index conversations by the day of their last activity.
"""
from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from datetime import UTC
from typing import Any

from infra.config.plans import Plan
from infra.config.settings import Settings
from infra.stores.conversations import Conversations
from infra.stores.crypto import DataKeys
from infra.stores.purging import mark_deleted
from schemas import CancelRequested, ConversationDeleted
from topics import Role, Topics
from topics.catalogue import CONTROL, DELETIONS, RETENTION
from topics.clients import make_producer, send
from topics.runner import Runner

log = logging.getLogger(__name__)
ROLE = Role(RETENTION, reads=(), writes=(DELETIONS, CONTROL))  # reads Cassandra, not a topic
DAY_S = 86_400


class RetentionSweeper(Runner):
    name = ROLE.stage

    def __init__(self, settings: Settings, conversations: Conversations, data_keys: DataKeys, redis: Any,
                 plans: Mapping[str, Plan]) -> None:
        super().__init__()
        self.settings, self.conversations, self.data_keys, self.redis = settings, conversations, data_keys, redis
        self.limits = {name: p.retention_days * DAY_S for name, p in plans.items() if p.retention_days > 0}
        self.topics = Topics(settings.topic_prefix)
        self.producer = make_producer(settings.kafka_bootstrap)

    def clients(self) -> list[Any]:
        return [self.producer]

    async def step(self) -> None:
        if self.limits:
            await self.sweep()
        await self.idle(self.settings.retention_sweep_s)

    async def sweep(self) -> int:
        """Delete what is past its plan's retention now; how many conversations were deleted."""
        now, plans, deleted = time.time(), {}, 0
        db = self.conversations.db
        page = await db.page("SELECT conversation_id, user_id, updated_at, deleted FROM conversations", (),
                             fetch_size=500)
        while True:
            for r in page.rows:
                if r.deleted or r.user_id is None:
                    continue
                if r.user_id not in plans:
                    rows = await db.execute("SELECT plan FROM users WHERE user_id = ?", (r.user_id,))
                    plans[r.user_id] = rows[0].plan if rows else None
                limit = self.limits.get(plans[r.user_id] or "")
                if limit is not None and r.updated_at.replace(tzinfo=UTC).timestamp() < now - limit:
                    await self.delete(r.conversation_id, r.user_id)
                    deleted += 1
            if page.paging_state is None:
                break
            page = await db.page("SELECT conversation_id, user_id, updated_at, deleted FROM conversations", (),
                                 fetch_size=500, paging_state=page.paging_state)
        if deleted:
            log.info("retention sweep deleted %d conversations", deleted)
        return deleted

    async def delete(self, conversation_id: str, user_id: str) -> None:
        generations = await mark_deleted(self.conversations, self.data_keys, self.redis, conversation_id, user_id)
        for g in generations:
            await send(self.producer, self.topics.control, CancelRequested(
                generation_id=g, conversation_id=conversation_id, user_id=user_id, reason="deleted"), key=g)
        await send(self.producer, self.topics.deletions, ConversationDeleted(
            conversation_id=conversation_id, user_id=user_id, reason="retention", generation_ids=generations),
            key=conversation_id)
        log.info("conversation %s deleted: past its plan's retention", conversation_id)
