"""Conversations, the sidebar list, and messages (siblings share turn and parent_id).

Writes are keyed so a retry overwrites the same row: a message by
(conversation, turn, message_id); a client_message_id claim is ``IF NOT EXISTS`` (two requests with one
client_message_id really race: the first must win, the other attach to its generation).
With a ``Sealer``, message content and titles are stored sealed with the conversation's
data key and opened on read (a destroyed key reads as no text).
"""
from __future__ import annotations

import asyncio
import base64
import dataclasses
from collections.abc import Awaitable
from dataclasses import dataclass, fields
from datetime import UTC, datetime
from typing import Any

from infra.stores import keys
from infra.stores.sealing import Sealer
from infra.stores.session import AsyncSession
from schemas import id_time, id_time_ms, new_id


@dataclass(frozen=True)
class Conversation:
    conversation_id: str
    user_id: str
    title: str | None
    model: str | None
    updated_at: datetime
    source: str = "page"  # "api": made by the OpenAI-compatible endpoints, kept out of the sidebar


SOURCES = ("page", "api")
CHANGED_TTL_S = 86_400  # a change mark outlives every row persistence remembers (consumers/persistence.py)


async def mark_changed(redis: Any, conversation_id: str) -> None:
    """Tell persistence that a conversation's row changed under it (renamed, deleted): it reads the row again
    before it next saves a reply there. A fresh value each time, so no later mark can equal one it saw."""
    await redis.set(keys.conversation_changed(conversation_id), new_id(), ex=CHANGED_TTL_S)


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
    block_category: str | None = None  # status blocked: what the safety check found, and by which rules
    rules_version: str | None = None


@dataclass(frozen=True)
class ClientMessageClaim:
    generation_id: str
    message_id: str
    turn: int
    created: bool  # False: an earlier request with the same client_message_id owns it


MESSAGE_COLUMNS = [f.name for f in fields(Message)]
# A list row: its key (owner, when it last moved, conversation) with what the list filters and shows besides the
# title, which ``list_for_user`` reads from the conversation's own row (one place to write a title).
_LIST = ("INSERT INTO conversations_by_user (user_id, updated_at, conversation_id, model, source) "
         "VALUES (?, ?, ?, ?, ?)")
_INSERT_MESSAGE = (f"INSERT INTO messages ({', '.join(MESSAGE_COLUMNS)}) "
                   f"VALUES ({', '.join('?' for _ in MESSAGE_COLUMNS)})")
_INSERT_MESSAGE_AT = f"{_INSERT_MESSAGE} USING TIMESTAMP ?"


def _insert_message(m: Message, placeholder_at_id_time: bool) -> tuple[str, tuple[Any, ...]]:
    values = tuple(getattr(m, c) for c in MESSAGE_COLUMNS)
    if placeholder_at_id_time and m.role == "assistant" and m.status == "generating" and id_time(m.message_id):
        return _INSERT_MESSAGE_AT, (*values, id_time_ms(m.message_id) * 1000)  # microseconds, as Cassandra's
    return _INSERT_MESSAGE, values


def _utc(ts: datetime) -> datetime:
    """The driver returns naive UTC datetimes; compare and store aware ones."""
    return ts.replace(tzinfo=UTC) if ts.tzinfo is None else ts


def _ms(ts: datetime) -> int:
    return int(ts.timestamp() * 1000)  # Cassandra keeps milliseconds


def _cursor(state: bytes | None) -> str | None:
    return base64.urlsafe_b64encode(state).decode() if state else None


def _state(cursor: str | None) -> bytes | None:
    return base64.urlsafe_b64decode(cursor.encode()) if cursor else None


class Conversations:
    def __init__(self, db: AsyncSession, sealer: Sealer | None = None) -> None:
        self.db, self.sealer = db, sealer

    async def _seal(self, conversation_id: str, text: str | None) -> str | None:
        return await self.sealer.seal_text(conversation_id, text) if self.sealer else text

    async def _open(self, conversation_id: str, value: str | None) -> str | None:
        return await self.sealer.open_text(conversation_id, value) if self.sealer else value

    async def _opened(self, m: Message) -> Message:
        return dataclasses.replace(m, content=await self._open(m.conversation_id, m.content) or "")

    async def create(self, user_id: str, model: str | None = None, title: str | None = None,
                     source: str = "page", listed: bool = True) -> Conversation:
        """A new conversation and its data key; ``listed=False``: not in the list until its first reply with text
        puts it there (``touch``, or ``list_where_made``), or never for a no-retention plan. Made at its id's
        time, so whoever holds the id knows the key of its first list row (``take_off_list``)."""
        conversation_id = new_id()
        now = id_time(conversation_id) or datetime.now(UTC)
        conv = Conversation(conversation_id, user_id, title, model, now, source)
        # Two waits, not four in a row (an OpenAI call makes one before its first token): the key (and, for a
        # conversation not listed, the owner's index of every conversation, which delete-all and export read
        # beside the list) go out together; the conversation's row, and its list row, once both are stored, so
        # no conversation exists without its key or outside both the list and that index. A listed one is found
        # by its list row: it leaves the list only when it is deleted (or by ``take_off_list``, which indexes it
        # first).
        first: list[Awaitable[Any]] = [] if listed else [self._index_owner(user_id, conversation_id)]
        if self.sealer is not None:
            first.append(self.sealer.keys.create(conversation_id, user_id))
        await asyncio.gather(*first)
        sealed = await self._seal(conversation_id, title)
        rows = [self.db.execute(
            "INSERT INTO conversations (conversation_id, user_id, title, model, created_at, updated_at, deleted, "
            "source) VALUES (?, ?, ?, ?, ?, ?, false, ?)", (conversation_id, user_id, sealed, model, now, now,
                                                            source))]
        if listed:
            rows.append(self.db.execute(_LIST, (user_id, now, conversation_id, model, source)))
        await asyncio.gather(*rows)
        return conv

    async def _index_owner(self, user_id: str, conversation_id: str) -> None:
        await self.db.execute("INSERT INTO conversations_of_user (user_id, conversation_id) VALUES (?, ?)",
                              (user_id, conversation_id))

    async def take_off_list(self, user_id: str, conversation_id: str) -> None:
        """Unlist a conversation listed when it was made and not moved since (an OpenAI call refused, or whose
        reply has no text): indexed as its owner's first, so delete-all and export still find it."""
        made = id_time(conversation_id)
        await self._index_owner(user_id, conversation_id)
        if made is None:
            await self.unlist(user_id, conversation_id)
            return
        await self.db.execute(
            "DELETE FROM conversations_by_user WHERE user_id = ? AND updated_at = ? AND conversation_id = ?",
            (user_id, made, conversation_id))

    async def get(self, conversation_id: str) -> Conversation | None:
        rows = await self.db.execute(
            "SELECT conversation_id, user_id, title, model, updated_at, deleted, source FROM conversations "
            "WHERE conversation_id = ?", (conversation_id,))
        if not rows or rows[0].deleted:
            return None
        r = rows[0]
        return Conversation(r.conversation_id, r.user_id, await self._open(r.conversation_id, r.title), r.model,
                            r.updated_at, r.source or "page")

    async def list_for_user(self, user_id: str, cursor: str | None = None, limit: int = 20,
                            source: str | None = "page") -> tuple[list[Conversation], str | None]:
        """Newest first, of one ``source`` (None: all). Stale rows left by concurrent bumps are skipped, not
        shown twice. Rows of other sources are skipped by reading on until ``limit`` rows are found, so
        a page of the sidebar is never empty while older conversations remain.

        A row whose conversation is deleted is skipped too: a reply saved while its owner deleted the
        conversation writes its list row, sees the deletion and takes the row back, and a list read in
        between would show the deleted conversation again."""
        seen: set[str] = set()
        items: list[Conversation] = []
        state = _state(cursor)
        while True:
            page = await self.db.page(
                "SELECT user_id, updated_at, conversation_id, model, source FROM conversations_by_user "
                "WHERE user_id = ?", (user_id,), fetch_size=limit, paging_state=state)
            rows = [r for r in page.rows if r.conversation_id not in seen and source in (None, r.source or "page")]
            live = await asyncio.gather(*(self._live(r.conversation_id, user_id) for r in rows))
            for r, (ok, title) in zip(rows, live, strict=True):
                if ok and r.conversation_id not in seen:
                    seen.add(r.conversation_id)
                    items.append(Conversation(r.conversation_id, r.user_id, title, r.model, r.updated_at,
                                              r.source or "page"))
            state = page.paging_state
            if items or not state:
                titles = await asyncio.gather(*(self._open(c.conversation_id, c.title) for c in items))
                return [dataclasses.replace(c, title=t) for c, t in zip(items, titles, strict=True)], _cursor(state)

    async def _live(self, conversation_id: str, user_id: str) -> tuple[bool, str | None]:
        """(Not deleted (nor purged) and still this user's, its title sealed): the title is read here, with the
        row every list read reads anyway, so a list row does not carry it and a title costs one write."""
        rows = await self.db.execute("SELECT user_id, deleted, title FROM conversations WHERE conversation_id = ?",
                                     (conversation_id,))
        ok = bool(rows) and not rows[0].deleted and rows[0].user_id == user_id
        return ok, rows[0].title if ok else None

    async def touch(self, conv: Conversation, at: datetime, title: str | None = None,
                    model: str | None = None) -> Conversation:
        """Move a conversation to the top of its owner's list (and optionally retitle it)."""
        before = _utc(conv.updated_at)
        at = max(_utc(at), before)
        new = Conversation(conv.conversation_id, conv.user_id, title or conv.title, model or conv.model, at,
                           conv.source)
        # The conversation's row and its list row: written together, one round trip instead of two. The new list
        # row and the old one's removal share the owner's partition: one unlogged batch, a single mutation, so a
        # list read never sees both rows or neither.
        # The title is written only when given: a reply saved while its owner renamed the conversation read the
        # row before the rename, and writing that title back undid the rename.
        listing: list[tuple[str, tuple[Any, ...]]] = [
            (_LIST, (conv.user_id, at, conv.conversation_id, new.model, conv.source))]
        if _ms(at) != _ms(before):
            listing.append(("DELETE FROM conversations_by_user WHERE user_id = ? AND updated_at = ? "
                            "AND conversation_id = ?", (conv.user_id, before, conv.conversation_id)))
        writes = [
            self.db.execute("UPDATE conversations SET updated_at = ?, title = ?, model = ? WHERE conversation_id = ?",
                            (at, await self._seal(conv.conversation_id, title), new.model, conv.conversation_id))
            if title is not None else
            self.db.execute("UPDATE conversations SET updated_at = ?, model = ? WHERE conversation_id = ?",
                            (at, new.model, conv.conversation_id)),
            self.db.execute(*listing[0]) if len(listing) == 1 else self.db.together(listing)]
        # Deleted while this touch ran (a reply saved as its owner deleted everything): the list row written here
        # is skipped by every list read (``list_for_user`` reads each row's conversation) and removed by the
        # purge, which unlists again after the last process could have held the conversation's key. No read
        # back here: it cost every reply a statement for a race the list already answers.
        await asyncio.gather(*writes)
        return new

    async def list_where_made(self, conv: Conversation) -> None:
        """List a conversation made unlisted (an OpenAI call's, once its reply has text) at the time it was made,
        which its own row still holds: one statement, and no update of that row (moving it to the top would cost
        the row's update; it was made seconds ago). A later ``touch`` takes this list row away as usual."""
        await self.db.execute(_LIST, (conv.user_id, _utc(conv.updated_at), conv.conversation_id, conv.model,
                                      conv.source))

    async def retitle(self, conv: Conversation, title: str) -> Conversation:
        """A new title, in place, for a listed conversation: its row alone (the list reads titles there), so
        the list keeps its order and a title costs one statement."""
        await self.db.execute("UPDATE conversations SET title = ? WHERE conversation_id = ?",
                              (await self._seal(conv.conversation_id, title), conv.conversation_id))
        return dataclasses.replace(conv, title=title)

    async def rename(self, conv: Conversation, title: str) -> None:
        """A new title, in place: the list keeps its order. A conversation not listed yet is listed now, as one
        named when it was made is (its list row is written again, so it keeps its model and source)."""
        await self.retitle(conv, title)
        await self.db.execute(_LIST, (conv.user_id, conv.updated_at, conv.conversation_id, conv.model,
                                      conv.source))

    async def ids_of_user(self, user_id: str) -> list[str]:
        """Every conversation id of a user, listed or not (deleted ones until their purge)."""
        owned = await self.db.execute("SELECT conversation_id FROM conversations_of_user WHERE user_id = ?",
                                      (user_id,))
        # Conversations made before the ownership table existed are found through their list rows.
        listed = await self.db.execute("SELECT conversation_id FROM conversations_by_user WHERE user_id = ?",
                                       (user_id,))
        return sorted({r.conversation_id for r in owned} | {r.conversation_id for r in listed})

    async def mark_deleted(self, conv: Conversation) -> None:
        """Gone from every read (``get`` answers None) and from its owner's list."""
        await self.db.execute("UPDATE conversations SET deleted = true WHERE conversation_id = ?",
                              (conv.conversation_id,))
        await self.unlist(conv.user_id, conv.conversation_id)

    async def unlist(self, user_id: str, conversation_id: str) -> int:
        """Remove every list row of a conversation (stale ones left by concurrent bumps included)."""
        rows = await self.db.execute(
            "SELECT updated_at FROM conversations_by_user WHERE user_id = ? AND conversation_id = ? ALLOW FILTERING",
            (user_id, conversation_id))
        await asyncio.gather(*(self.db.execute(
            "DELETE FROM conversations_by_user WHERE user_id = ? AND updated_at = ? AND conversation_id = ?",
            (user_id, r.updated_at, conversation_id)) for r in rows))
        return len(rows)

    async def save_message(self, message: Message) -> None:
        await self.save_messages([message])

    async def save_messages(self, messages: list[Message], placeholder_at_id_time: bool = False) -> None:
        """Messages of one conversation in one statement: a user message and its reply's placeholder share the
        conversation's partition, so they are one unlogged batch (one mutation: both rows or neither).
        ``placeholder_at_id_time``: a reply's placeholder is written as of its id's time, so it never overwrites
        the saved reply (written later) when a record is applied again by a writer that did not read it."""
        if len({m.conversation_id for m in messages}) > 1:
            raise ValueError("save_messages: one conversation's messages only (one partition)")
        sealed = [dataclasses.replace(m, content=await self._seal(m.conversation_id, m.content) or "")
                  for m in messages]
        statements = [_insert_message(m, placeholder_at_id_time) for m in sealed]
        if len(statements) == 1:
            await self.db.execute(*statements[0])
        elif statements:
            await self.db.together(statements)

    async def delete_message(self, conversation_id: str, turn: int, message_id: str) -> None:
        await self.db.execute("DELETE FROM messages WHERE conversation_id = ? AND turn = ? AND message_id = ?",
                              (conversation_id, turn, message_id))

    async def messages(self, conversation_id: str, cursor: str | None = None,
                       limit: int = 100) -> tuple[list[Message], str | None]:
        """Oldest first, every sibling included."""
        page = await self.db.page(
            f"SELECT {', '.join(MESSAGE_COLUMNS)} FROM messages WHERE conversation_id = ?",
            (conversation_id,), fetch_size=limit, paging_state=_state(cursor))
        return await self._all_opened(page.rows), _cursor(page.paging_state)

    async def all_messages(self, conversation_id: str) -> list[Message]:
        rows = await self.db.execute(
            f"SELECT {', '.join(MESSAGE_COLUMNS)} FROM messages WHERE conversation_id = ?", (conversation_id,))
        return await self._all_opened(rows)

    async def _all_opened(self, rows: list[object]) -> list[Message]:
        return [await self._opened(Message(**{c: getattr(r, c) for c in MESSAGE_COLUMNS})) for r in rows]

    async def get_message(self, conversation_id: str, turn: int, message_id: str) -> Message | None:
        rows = await self.db.execute(
            f"SELECT {', '.join(MESSAGE_COLUMNS)} FROM messages WHERE conversation_id = ? AND turn = ? "
            "AND message_id = ?", (conversation_id, turn, message_id))
        return await self._opened(Message(**{c: getattr(rows[0], c) for c in MESSAGE_COLUMNS})) if rows else None

    async def messages_of_turn(self, conversation_id: str, turn: int, message_ids: set[str]) -> dict[str, Message]:
        """Of one turn's messages (a partition slice: one statement), those named, opened, by id."""
        rows = await self.db.execute(
            f"SELECT {', '.join(MESSAGE_COLUMNS)} FROM messages WHERE conversation_id = ? AND turn = ?",
            (conversation_id, turn))
        return {r.message_id: await self._opened(Message(**{c: getattr(r, c) for c in MESSAGE_COLUMNS}))
                for r in rows if r.message_id in message_ids}

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
