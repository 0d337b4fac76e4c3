"""Deletion through the real Cassandra, Redis and Kafka: sealed at rest, hidden at once, purged by the
stage (no row, no Redis key), ``ConversationPurged`` produced, a second purge harmless, and a
conversation past its plan's retention deleted by the same path."""
from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from consumers import purge as purge_stage
from consumers.retention import RetentionSweeper
from infra.config.plans import Plan
from infra.config.settings import Settings
from infra.stores import keys
from infra.stores.accounts import Accounts
from infra.stores.conversations import Conversations, Message
from infra.stores.crypto import DataKeys, LocalTenantKeys
from infra.stores.purging import mark_deleted
from infra.stores.records import Records, Summary
from infra.stores.sealing import Sealer
from infra.stores.search import SearchIndex, blind, shard
from schemas import ConversationDeleted, ConversationPurged, decode, new_id
from topics import Topics
from topics.clients import make_consumer, make_producer, send

PHRASE = "zebra-quartz-{}"
TABLES = {"messages": "conversation_id", "messages_by_client_id": "conversation_id", "summaries": "conversation_id",
          "conversations": "conversation_id", "conversation_keys": "conversation_id"}


@pytest.fixture
def sealer(db: Any, tmp_path: Path) -> Sealer:
    return Sealer(DataKeys(db, LocalTenantKeys.under(tmp_path), cache_s=1.0))


async def seed(db: Any, redis: Any, sealer: Sealer, user_id: str, exchanges: int) -> tuple[str, list[str]]:
    """A conversation with ``exchanges`` user/assistant pairs, a summary, claims and every Redis key a chat makes."""
    conversations, records = Conversations(db, sealer), Records(db, sealer)
    conv = await conversations.create(user_id, title=PHRASE.format("title"))
    cid, gens = conv.conversation_id, []
    for turn in range(exchanges):
        gen = new_id()
        gens.append(gen)
        await conversations.claim_client_message(cid, f"cm-{turn}", gen, f"u-{turn}", turn)
        await conversations.save_message(Message(cid, turn, f"u-{turn}", "user", PHRASE.format(turn),
                                                 generation_id=gen, client_message_id=f"cm-{turn}"))
        await conversations.save_message(Message(cid, turn, gen, "assistant", PHRASE.format(f"r{turn}"),
                                                 generation_id=gen, parent_id=f"u-{turn}"))
        await SearchIndex(db, conversations).index(user_id, cid, f"u-{turn}", turn, PHRASE.format(turn))
        await records.save_generation(generation_id=gen, conversation_id=cid, user_id=user_id, message_id=gen,
                                      user_message_id=f"u-{turn}", turn=turn, status="complete", model_pool="small")
        await redis.set(keys.generation_owner(gen), f"{user_id} {cid}")
        await redis.set(keys.reader_heartbeat(gen), "gw")
        await redis.set(keys.generation_started(gen), "1")
        await redis.set(keys.client_message(cid, f"cm-{turn}"), gen)
        await redis.sadd(keys.conversation_generations(cid), gen)
        await redis.hset(keys.settled(gen), mapping={"charged": "10", "conversation_id": cid})
    await records.save_summary(Summary(cid, 0, PHRASE.format("summary"), 12))
    await redis.set(keys.title_requested(cid), gens[0])
    return cid, gens


async def rows_left(db: Any, cid: str, gens: list[str], user_id: str) -> dict[str, int]:
    left = {t: len(await db.execute(f"SELECT * FROM {t} WHERE {c} = ?", (cid,))) for t, c in TABLES.items()}
    left["generations"] = sum([len(await db.execute("SELECT * FROM generations WHERE generation_id = ?", (g,)))
                               for g in gens])
    left["conversations_by_user"] = len(await db.execute(
        "SELECT * FROM conversations_by_user WHERE user_id = ? AND conversation_id = ? ALLOW FILTERING",
        (user_id, cid)))
    left["conversations_of_user"] = len(await db.execute(
        "SELECT * FROM conversations_of_user WHERE user_id = ? AND conversation_id = ?", (user_id, cid)))
    return {t: n for t, n in left.items() if n}


async def redis_left(redis: Any, cid: str, gens: list[str]) -> list[str]:
    names = [keys.conversation_generations(cid), keys.title_requested(cid)]
    names += [keys.client_message(cid, f"cm-{i}") for i in range(len(gens))]
    for g in gens:
        names += [keys.generation_owner(g), keys.reader_heartbeat(g), keys.generation_started(g)]
    left = [n for n in names if await redis.exists(n)]
    left += [keys.settled(g) for g in gens if await redis.hexists(keys.settled(g), "conversation_id")]
    return left


async def purged_events(settings: Settings, count: int, timeout: float = 90) -> list[ConversationPurged]:
    reader = make_consumer(settings.kafka_bootstrap, Topics(settings.topic_prefix).purges, group_id=None)
    await reader.start()
    got: list[Any] = []
    try:
        deadline = time.monotonic() + timeout
        while len(got) < count and time.monotonic() < deadline:
            for records in (await reader.getmany(timeout_ms=500)).values():
                got += [decode(r.value, (ConversationPurged,)) for r in records]
    finally:
        await reader.stop()
    return got


async def test_delete_hides_at_once_and_the_purge_leaves_nothing(settings: Settings, db: Any, redis_client: Any,
                                                                 sealer: Sealer) -> None:
    user = new_id()
    cid, gens = await seed(db, redis_client, sealer, user, exchanges=25)  # 50 messages
    raw = await db.execute("SELECT content FROM messages WHERE conversation_id = ?", (cid,))
    assert len(raw) == 50 and not any("zebra" in r.content for r in raw)  # sealed at rest
    assert PHRASE.format(0) in {m.content for m in await Conversations(db, sealer).all_messages(cid)}

    conversations = Conversations(db, sealer)
    _, term = blind(sealer.keys.tenants.index_key(user), user, "zebra")  # keyed: only the key holder can compute it
    zebra = (shard(cid), term)  # every row of a conversation is in its shard
    assert await db.execute("SELECT * FROM search_terms WHERE user_id = ? AND bucket = ? AND term = ?",
                            (user, *zebra))  # indexed (blind) while it lived
    cancelled = await mark_deleted(conversations, sealer.keys, redis_client, cid, user)
    assert set(cancelled) == set(gens)
    assert await conversations.get(cid) is None  # hidden at once
    assert cid not in {c.conversation_id for c in (await conversations.list_for_user(user))[0]}
    assert not await redis_client.exists(keys.generation_owner(gens[0]))  # cancel/resume: 404 at once
    assert not await db.execute("SELECT * FROM search_terms WHERE user_id = ? AND bucket = ? AND term = ?",
                                (user, *zebra))  # out of search at once
    assert all(m.content == "" for m in await conversations.all_messages(cid))  # key gone: no text reads

    stage = purge_stage.build_stage(settings.with_(purge_delay_s=0.0), db, redis_client, sealer.keys)
    task = asyncio.create_task(stage.run())
    producer = make_producer(settings.kafka_bootstrap)
    await producer.start()
    try:
        began = time.perf_counter()
        deleted = ConversationDeleted(conversation_id=cid, user_id=user, generation_ids=cancelled)
        await send(producer, Topics(settings.topic_prefix).deletions, deleted, key=cid)
        [purged] = await purged_events(settings, 1)
        took = time.perf_counter() - began
        print(f"purge of a 50-message conversation: {took * 1000:.0f} ms from ConversationDeleted to "
              f"ConversationPurged; {purged.removed}")
        assert purged.conversation_id == cid and purged.reason == "user"
        assert purged.removed["messages"] == 50 and purged.removed["generations"] == 25
        assert purged.removed["summaries"] == 1 and purged.removed["client_message_claims"] == 25
        assert await rows_left(db, cid, gens, user) == {}
        assert await redis_left(redis_client, cid, gens) == []
        assert await redis_client.hget(keys.settled(gens[0]), "charged") == b"10"  # the charge stays
        [gone] = await db.execute("SELECT * FROM deleted_conversations WHERE conversation_id = ?", (cid,))
        assert gone.user_id == user and set(gone._fields) == {"conversation_id", "user_id", "purged_at"}  # no text

        await send(producer, Topics(settings.topic_prefix).deletions, deleted, key=cid)  # redelivered
        second = await purged_events(settings, 2)
        assert len(second) == 2 and second[1].removed["messages"] == 0
    finally:
        await producer.stop()
        stage.stop()
        await asyncio.wait_for(task, 30)


async def test_a_conversation_past_its_plans_retention_is_purged_by_the_same_path(
        settings: Settings, db: Any, redis_client: Any, sealer: Sealer) -> None:
    user, _ = await Accounts(db).create_user("private")
    old, old_gens = await seed(db, redis_client, sealer, user.user_id, exchanges=2)
    fresh, _ = await seed(db, redis_client, sealer, user.user_id, exchanges=1)
    await db.execute("UPDATE conversations SET updated_at = ? WHERE conversation_id = ?",
                     (datetime.now(UTC) - timedelta(hours=2), old))
    plan = Plan("private", 1, 1, 1, 1, 1, 1.0, "paid", retention_days=1 / 24)  # one hour
    sweeper = RetentionSweeper(settings, Conversations(db, sealer), sealer.keys, redis_client, {"private": plan})
    stage = purge_stage.build_stage(settings.with_(purge_delay_s=0.0), db, redis_client, sealer.keys)
    task = asyncio.create_task(stage.run())
    await sweeper.producer.start()
    try:
        assert await sweeper.sweep() >= 1
        [purged] = await purged_events(settings, 1)
        assert purged.conversation_id == old and purged.reason == "retention"
        assert await rows_left(db, old, old_gens, user.user_id) == {}
        assert await Conversations(db, sealer).get(fresh) is not None  # younger than the limit: kept
    finally:
        await sweeper.producer.stop()
        stage.stop()
        await asyncio.wait_for(task, 30)
