"""Deleting a conversation: the request to purge it, and the audit record of what was removed."""
from __future__ import annotations

from typing import Literal

from schemas.base import Event

DeletionReason = Literal["user", "account", "retention"]


class ConversationDeleted(Event, frozen=True, kw_only=True):
    """Hidden everywhere and its data key destroyed; topic ``chat.deletions``, read by the purge stage."""

    conversation_id: str
    user_id: str
    reason: DeletionReason = "user"
    generation_ids: list[str] = []  # generations known for it (Redis), cancelled at deletion


class ConversationPurged(Event, frozen=True, kw_only=True):
    """Everything derived from a deleted conversation is gone; topic ``audit.purges`` (no text, ids and counts)."""

    conversation_id: str
    user_id: str
    reason: DeletionReason
    deleted_at: float
    removed: dict[str, int]  # what -> how many: messages, generations, summaries, redis_keys, ...
