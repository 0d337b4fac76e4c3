"""Removing everything a deleted conversation left in Cassandra and Redis.

Every step is a delete by key, so running it twice (a restarted purge, a redelivered
deletion) removes nothing more and fails on nothing. Aggregates stay: ``usage_by_day``
is per user and day and names no conversation; the settlement markers in Redis keep the
charge but lose the conversation id.
"""
from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from typing import Any

from infra.stores import keys
from infra.stores.conversations import Conversations, mark_changed
from infra.stores.crypto import DataKeys
from infra.stores.search import SearchIndex
from infra.stores.session import AsyncSession
from infra.stores.shares import Shares


async def mark_deleted(conversations: Conversations, data_keys: DataKeys, redis: Any,
                       conversation_id: str, user_id: str) -> list[str]:
    """Hide the conversation at once and destroy its data key; the generations to cancel.

    The owner keys go too, so cancel and resume answer 404 from this moment on any gateway, and so do its
    search rows (found from its words, which can be read only now, before the key is destroyed), and its
    share links."""
    db = conversations.db
    conv = await conversations.get(conversation_id)
    texts = [m.content for m in await conversations.all_messages(conversation_id)] + [conv.title or ""] if conv else []
    await db.execute("UPDATE conversations SET deleted = true WHERE conversation_id = ?", (conversation_id,))
    await mark_changed(redis, conversation_id)  # persistence sees it at once, before it hears of the key
    await SearchIndex(db, conversations).forget(user_id, conversation_id, texts)
    await conversations.unlist(user_id, conversation_id)
    await Shares(db).forget_conversation(user_id, conversation_id)
    rows = await db.execute("SELECT generation_id FROM messages WHERE conversation_id = ?", (conversation_id,))
    known = {m.decode() for m in await redis.smembers(keys.conversation_generations(conversation_id))}
    generations = sorted(known | {r.generation_id for r in rows if r.generation_id})
    await data_keys.destroy(conversation_id)
    if generations:
        await redis.delete(*(keys.generation_owner(g) for g in generations))
    return generations


async def purge(db: AsyncSession, data_keys: DataKeys, redis: Any, conversation_id: str, user_id: str,
                generation_ids: list[str]) -> dict[str, int]:
    """Delete every row and key of the conversation; counts of what was there."""
    messages = await db.execute("SELECT generation_id FROM messages WHERE conversation_id = ?", (conversation_id,))
    claims = await db.execute("SELECT client_message_id FROM messages_by_client_id WHERE conversation_id = ?",
                              (conversation_id,))
    summaries = await db.execute("SELECT upto_turn FROM summaries WHERE conversation_id = ?", (conversation_id,))
    known = {m.decode() for m in await redis.smembers(keys.conversation_generations(conversation_id))}
    generations = sorted(set(generation_ids) | known | {r.generation_id for r in messages if r.generation_id})
    saved = [g for g in generations if await db.execute(
        "SELECT generation_id FROM generations WHERE generation_id = ?", (g,))]
    listed = await Conversations(db).unlist(user_id, conversation_id)
    shares = await Shares(db).forget_conversation(user_id, conversation_id)  # any made while it was deleted
    await data_keys.destroy(conversation_id)
    await asyncio.gather(
        db.execute("DELETE FROM messages WHERE conversation_id = ?", (conversation_id,)),
        db.execute("DELETE FROM messages_by_client_id WHERE conversation_id = ?", (conversation_id,)),
        db.execute("DELETE FROM summaries WHERE conversation_id = ?", (conversation_id,)),
        *(db.execute("DELETE FROM generations WHERE generation_id = ?", (g,)) for g in saved))
    redis_keys = await _purge_redis(redis, conversation_id, generations, [r.client_message_id for r in claims])
    await db.execute("DELETE FROM conversations_of_user WHERE user_id = ? AND conversation_id = ?",
                     (user_id, conversation_id))
    # The conversation row goes last: until then a restarted purge still finds what it was for. Its id and
    # owner stay a while (no text), so the owner's repeated delete is still answered as a success.
    await db.execute("INSERT INTO deleted_conversations (conversation_id, user_id, purged_at) VALUES (?, ?, ?)",
                     (conversation_id, user_id, datetime.now(UTC)))
    await db.execute("DELETE FROM conversations WHERE conversation_id = ?", (conversation_id,))
    return {"messages": len(messages), "client_message_claims": len(claims), "summaries": len(summaries),
            "generations": len(saved), "list_rows": listed, "shares": shares, "redis_keys": redis_keys}


async def _purge_redis(redis: Any, conversation_id: str, generations: list[str], client_ids: list[str]) -> int:
    names = [keys.conversation_generations(conversation_id), keys.title_requested(conversation_id)]
    names += [keys.client_message(conversation_id, c) for c in client_ids]
    for g in generations:
        names += [keys.generation_owner(g), keys.reader_heartbeat(g), keys.generation_started(g),
                  keys.abandoned_cancelled(g)]
    async with redis.pipeline(transaction=False) as pipe:
        pipe.delete(*names)
        # Settlement's markers keep the charge (exactly-once) but no longer name the conversation.
        for g in generations:
            pipe.hdel(keys.settled(g), "conversation_id")
            pipe.hdel(keys.reservation(g), "conversation_id")
        removed = await pipe.execute()
    return int(removed[0])
