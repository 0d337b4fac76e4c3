"""Conversations, the sidebar list, and messages (siblings share turn and parent_id).

Writes are keyed so a retry overwrites the same row: a message by
(conversation, turn, message_id); a client_message_id claim is ``IF NOT EXISTS``.
"""
from __future__ import annotations

from dataclasses import dataclass, fields
from datetime import UTC, datetime

from infra.stores.session import AsyncSession
from schemas import new_id


@dataclass(frozen=True)
class Conversation:
    conversation_id: str
    user_id: str
    title: str | None
    model: str | None
    updated_at: datetime


@dataclass(frozen=True)
class Message:
    conversation_id: str
    turn: int
    message_id: str
    role: str
    content: str
    status: str = "complete"
    tokens_in: int = 0
    tokens_out: int = 0
    tokens_cached: int = 0
    model: str | None = None
    pool: str | None = None
    parent_id: str | None = None
    generation_id: str | None = None
    client_message_id: str | None = None
    route_reason: str | None = None
    created_at: datetime | None = None
    finished_at: datetime | None = None


@dataclass(frozen=True)
class ClientMessageClaim:
    generation_id: str
    message_id: str
    turn: int
    created: bool  # False: an earlier request with the same client_message_id owns it


MESSAGE_COLUMNS = [f.name for f in fields(Message)]


def _utc(ts: datetime) -> datetime:
    """The driver returns naive UTC datetimes; compare and store aware ones."""
    return ts.replace(tzinfo=UTC) if ts.tzinfo is None else ts


def _ms(ts: datetime) -> int:
    return int(ts.timestamp() * 1000)  # Cassandra keeps milliseconds


class Conversations:
    def __init__(self, db: AsyncSession) -> None:
        self.db = db

    async def create(self, user_id: str, model: str | None = None, title: str | None = None) -> Conversation:
        now = datetime.now(UTC)
        conv = Conversation(new_id(), user_id, title, model, now)
        await self.db.execute(
            "INSERT INTO conversations (conversation_id, user_id, title, model, created_at, updated_at, deleted) "
            "VALUES (?, ?, ?, ?, ?, ?, false)", (conv.conversation_id, user_id, title, model, now, now))
        await self.db.execute(
            "INSERT INTO conversations_by_user (user_id, updated_at, conversation_id, title, model) "
            "VALUES (?, ?, ?, ?, ?)", (user_id, now, conv.conversation_id, title, model))
        return conv

    async def get(self, conversation_id: str) -> Conversation | None:
        rows = await self.db.execute(
            "SELECT conversation_id, user_id, title, model, updated_at, deleted FROM conversations "
            "WHERE conversation_id = ?", (conversation_id,))
        if not rows or rows[0].deleted:
            return None
        r = rows[0]
        return Conversation(r.conversation_id, r.user_id, r.title, r.model, r.updated_at)

    async def list_for_user(self, user_id: str, paging_state: bytes | None = None,
                            limit: int = 20) -> tuple[list[Conversation], bytes | None]:
        """Newest first. Stale rows left by concurrent bumps are skipped, not shown twice.

        ``paging_state`` must come from an earlier call (the gateway signs it before a client holds it)."""
        page = await self.db.page(
            "SELECT user_id, updated_at, conversation_id, title, model FROM conversations_by_user "
            "WHERE user_id = ?", (user_id,), fetch_size=limit, paging_state=paging_state)
        seen: set[str] = set()
        items = []
        for r in page.rows:
            if r.conversation_id not in seen:
                seen.add(r.conversation_id)
                items.append(Conversation(r.conversation_id, r.user_id, r.title, r.model, r.updated_at))
        return items, page.paging_state

    async def touch(self, conv: Conversation, at: datetime, title: str | None = None,
                    model: str | None = None) -> Conversation:
        """Move a conversation to the top of its owner's list (and optionally retitle it)."""
        before = _utc(conv.updated_at)
        at = max(_utc(at), before)
        new = Conversation(conv.conversation_id, conv.user_id, title or conv.title, model or conv.model, at)
        await self.db.execute(
            "UPDATE conversations SET updated_at = ?, title = ?, model = ? WHERE conversation_id = ?",
            (at, new.title, new.model, conv.conversation_id))
        await self.db.execute(
            "INSERT INTO conversations_by_user (user_id, updated_at, conversation_id, title, model) "
            "VALUES (?, ?, ?, ?, ?)", (conv.user_id, at, conv.conversation_id, new.title, new.model))
        if _ms(at) != _ms(before):
            await self.db.execute(
                "DELETE FROM conversations_by_user WHERE user_id = ? AND updated_at = ? AND conversation_id = ?",
                (conv.user_id, before, conv.conversation_id))
        return new

    async def save_message(self, message: Message) -> None:
        placeholders = ", ".join("?" for _ in MESSAGE_COLUMNS)
        await self.db.execute(
            f"INSERT INTO messages ({', '.join(MESSAGE_COLUMNS)}) VALUES ({placeholders})",
            tuple(getattr(message, c) for c in MESSAGE_COLUMNS))

    async def delete_message(self, conversation_id: str, turn: int, message_id: str) -> None:
        await self.db.execute("DELETE FROM messages WHERE conversation_id = ? AND turn = ? AND message_id = ?",
                              (conversation_id, turn, message_id))

    async def messages(self, conversation_id: str, paging_state: bytes | None = None,
                       limit: int = 100) -> tuple[list[Message], bytes | None]:
        """Oldest first, every sibling included."""
        page = await self.db.page(
            f"SELECT {', '.join(MESSAGE_COLUMNS)} FROM messages WHERE conversation_id = ?",
            (conversation_id,), fetch_size=limit, paging_state=paging_state)
        return [Message(**{c: getattr(r, c) for c in MESSAGE_COLUMNS}) for r in page.rows], page.paging_state

    async def all_messages(self, conversation_id: str) -> list[Message]:
        rows = await self.db.execute(
            f"SELECT {', '.join(MESSAGE_COLUMNS)} FROM messages WHERE conversation_id = ?", (conversation_id,))
        return [Message(**{c: getattr(r, c) for c in MESSAGE_COLUMNS}) for r in rows]

    async def get_message(self, conversation_id: str, turn: int, message_id: str) -> Message | None:
        rows = await self.db.execute(
            f"SELECT {', '.join(MESSAGE_COLUMNS)} FROM messages WHERE conversation_id = ? AND turn = ? "
            "AND message_id = ?", (conversation_id, turn, message_id))
        return Message(**{c: getattr(rows[0], c) for c in MESSAGE_COLUMNS}) if rows else None

    async def claim_client_message(self, conversation_id: str, client_message_id: str, generation_id: str,
                                   message_id: str, turn: int) -> ClientMessageClaim:
        """Lightweight transaction: the first request with this client_message_id wins."""
        rows = await self.db.execute(
            "INSERT INTO messages_by_client_id (conversation_id, client_message_id, generation_id, message_id, "
            "turn) VALUES (?, ?, ?, ?, ?) IF NOT EXISTS",
            (conversation_id, client_message_id, generation_id, message_id, turn))
        row = rows[0]
        if row.applied:
            return ClientMessageClaim(generation_id, message_id, turn, True)
        return ClientMessageClaim(row.generation_id, row.message_id, row.turn, False)
