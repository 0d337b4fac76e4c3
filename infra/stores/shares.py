"""Read-only share links: a snapshot of a conversation, readable by anyone who has its unguessable id.

The snapshot (title and the messages on screen when it was made) is stored as one JSON value sealed
with the conversation's data key: deleting the conversation destroys the key, so no copy of a share
can be read afterwards, and ``forget_conversation`` (called by the delete and by the purge) removes
the rows too. A share id is 128 random bits, never derived from the conversation's or user's ids.
"""
from __future__ import annotations

import json
import secrets
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from infra.stores.sealing import Sealer
from infra.stores.session import AsyncSession
from schemas.errors import ParleyError

MAX_SHARES_PER_USER = 500


@dataclass(frozen=True)
class Share:
    share_id: str
    conversation_id: str
    created_at: datetime
    message_count: int


@dataclass(frozen=True)
class Snapshot:
    share_id: str
    created_at: datetime
    content: dict[str, Any]  # {"title", "messages": [...]}, as sealed


class TooManyShares(ParleyError):
    status = 429  # as the gateway answers it


def new_share_id() -> str:
    return secrets.token_urlsafe(16)


class Shares:
    def __init__(self, db: AsyncSession, sealer: Sealer | None = None) -> None:
        self.db, self.sealer = db, sealer  # the sealer reads and writes snapshots; revoking needs none

    async def create(self, user_id: str, conversation_id: str, content: dict[str, Any]) -> Share:
        """Two inserts, keyed by a new random id (no lightweight transaction: the id is new by construction)."""
        if len(await self.of_user(user_id)) >= MAX_SHARES_PER_USER:
            raise TooManyShares
        assert self.sealer is not None
        share = Share(new_share_id(), conversation_id, datetime.now(UTC), len(content["messages"]))
        sealed = await self.sealer.seal_text(conversation_id, json.dumps(content, ensure_ascii=False))
        await self.db.execute(
            "INSERT INTO shares (share_id, conversation_id, user_id, snapshot, message_count, created_at) "
            "VALUES (?, ?, ?, ?, ?, ?)",
            (share.share_id, conversation_id, user_id, sealed, share.message_count, share.created_at))
        await self.db.execute(
            "INSERT INTO shares_by_user (user_id, share_id, conversation_id, message_count, created_at) "
            "VALUES (?, ?, ?, ?, ?)",
            (user_id, share.share_id, conversation_id, share.message_count, share.created_at))
        return share

    async def read(self, share_id: str) -> Snapshot | None:
        """The snapshot; None when there is no such share or its conversation's key is gone."""
        rows = await self.db.execute(
            "SELECT conversation_id, snapshot, created_at FROM shares WHERE share_id = ?", (share_id,))
        if not rows:
            return None
        assert self.sealer is not None
        text = await self.sealer.open_text(rows[0].conversation_id, rows[0].snapshot)
        if text is None:
            return None
        return Snapshot(share_id, rows[0].created_at, json.loads(text))

    async def owner(self, share_id: str) -> str | None:
        rows = await self.db.execute("SELECT user_id FROM shares WHERE share_id = ?", (share_id,))
        return rows[0].user_id if rows else None

    async def of_user(self, user_id: str, conversation_id: str | None = None) -> list[Share]:
        """Newest first; of one conversation if given."""
        rows = await self.db.execute(
            "SELECT share_id, conversation_id, message_count, created_at FROM shares_by_user WHERE user_id = ?",
            (user_id,))
        shares = [Share(r.share_id, r.conversation_id, r.created_at, r.message_count or 0) for r in rows
                  if conversation_id is None or r.conversation_id == conversation_id]
        return sorted(shares, key=lambda s: s.created_at, reverse=True)

    async def revoke(self, user_id: str, share_id: str) -> None:
        await self.db.execute("DELETE FROM shares WHERE share_id = ?", (share_id,))
        await self.db.execute("DELETE FROM shares_by_user WHERE user_id = ? AND share_id = ?", (user_id, share_id))

    async def forget_conversation(self, user_id: str, conversation_id: str) -> int:
        """Revoke every share of a conversation (its deletion); running it again removes nothing more."""
        shares = await self.of_user(user_id, conversation_id)
        for s in shares:
            await self.revoke(user_id, s.share_id)
        return len(shares)
