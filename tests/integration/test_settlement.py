"""Settlement and the usage rollup through real Kafka, Redis and Cassandra: duplicates, a crash
between settle and publish, and a restart mid-way charge nothing twice; billing replay agrees."""
from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import msgspec

from consumers import settlement
from infra.config.plans import Plan
from infra.config.settings import Settings
from infra.stores import keys
from infra.stores.quota import Quota
from infra.stores.quota_outcomes import Reservation
from infra.stores.records import Records
from infra.stores.settling import charge_for
from schemas import GenerationFinished, Usage, UsageRecorded
from streams import billing, usage_rollup
from topics import Topics
from topics.clients import make_producer, send
from topics.replay import replay

PLAN = Plan("free", daily_tokens=1_000_000, bucket_tokens_per_minute=1_000_000, bucket_burst=1_000_000,
            max_running=20, reply_cap=512, queue_wait_limit_s=10, lane="free")


async def eventually(check: Callable[[], Awaitable[bool]], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not await check():
        assert time.monotonic() < deadline, f"timed out waiting for {check.__name__}"
        await asyncio.sleep(0.2)


def finished(gen: str, user: str, prompt: int, out: int, status: str = "complete",
             purpose: str = "reply") -> GenerationFinished:
    return GenerationFinished(generation_id=gen, conversation_id=f"c-{gen}", user_id=user, plan="free",
                              message_id=gen, status=status, text="", model="SmolLM2", pool="small",  # type: ignore[arg-type]
                              worker_id="w1", purpose=purpose,  # type: ignore[arg-type]
                              usage=Usage(prompt_tokens=prompt, completion_tokens=out,
                                          cached_prompt_tokens=prompt // 2))


async def test_settlement_and_rollup_charge_once_through_duplicates_and_a_restart(
        settings: Settings, redis_client: Any, db: Any) -> None:
    topics, records = Topics(settings.topic_prefix), Records(db)
    quota = Quota(redis_client, {"free": PLAN}, scope=settings.topic_prefix)
    since = datetime.now(UTC) - timedelta(minutes=1)
    users = [uuid.uuid4().hex, uuid.uuid4().hex]
    replies = []
    for i in range(10):
        gen, user = uuid.uuid4().hex, users[i % 2]
        reserved = await quota.reserve(user, "free", gen, 300 + i, conversation_id=f"c-{gen}")
        assert isinstance(reserved, Reservation)
        day = reserved.day
        replies.append(finished(gen, user, 300 + i, 10 * i, ("complete", "stopped", "failed")[i % 3]))
    # A failed reply here failed in the engine (it reports usage): it is charged that usage like the others.
    want = {u: sum(sum(charge_for(r)) for r in replies if r.user_id == u) for u in users}
    # A previous settlement incarnation settled this one and died before publishing its usage.
    crashed = replies[3]
    assert await quota.settle(crashed.generation_id, crashed.usage.prompt_tokens,
                              crashed.usage.completion_tokens, tokens_cached=crashed.usage.cached_prompt_tokens,
                              status=crashed.status, model=crashed.model, pool=crashed.pool) is not None

    producer = make_producer(settings.kafka_bootstrap)
    await producer.start()
    rollup = usage_rollup.build_app(settings, records)
    first = settlement.build_stage(settings, quota)
    await rollup.start()
    first_run = asyncio.create_task(first.run())
    try:
        for r in replies[:5] + [replies[1], finished(uuid.uuid4().hex, users[0], 50, 5, purpose="title")]:
            await send(producer, topics.replies, r, key=r.conversation_id)

        async def first_half_published() -> bool:
            markers = [await quota.settled(r.generation_id) for r in replies[:5]]
            return all(m is not None and m.published for m in markers)

        await eventually(first_half_published)
        # Settlement died between Kafka's ack and the published flag: the same record goes out twice.
        again = await quota.settled(replies[0].generation_id)
        assert again is not None
        await send(producer, topics.usage, again.usage_recorded(), key=again.user_id)
        for r in replies[5:7]:  # in flight when settlement stops: handled now or after the restart
            await send(producer, topics.replies, r, key=r.conversation_id)
        first.stop()
        await first_run
        for r in replies[7:] + [replies[6], replies[0]]:
            await send(producer, topics.replies, r, key=r.conversation_id)
        second = settlement.build_stage(settings, quota)
        second_run = asyncio.create_task(second.run())
        try:
            async def all_published() -> bool:
                return await quota.unpublished() == [] and await quota.expired(time.time() + 3600) == []

            await eventually(all_published)

            async def rolled_up() -> bool:
                rows = [await records.usage_day(u, day) for u in users]
                return all(row is not None and row.replies == 5 for row in rows)

            await eventually(rolled_up)
            await asyncio.sleep(1.0)  # let any late duplicate reach the rollup before checking totals
        finally:
            second.stop()
            await second_run

        for user in users:
            mine = [r for r in replies if r.user_id == user]
            snap = await quota.snapshot(user, "free")
            assert (snap["used"], snap["reserved"], snap["running"], snap["replies"]) == (want[user], 0, 0, 5)
            row = await records.usage_day(user, day)
            assert row is not None
            charged = mine  # a reply that failed in the engine is charged what it read and wrote
            assert (row.tokens_in, row.tokens_out, row.tokens_cached, row.replies) == (
                sum(r.usage.prompt_tokens for r in charged), sum(r.usage.completion_tokens for r in charged),
                sum(r.usage.cached_prompt_tokens for r in charged), 5)
        published = await _usage(settings)
        assert {u.generation_id for u in published} == {r.generation_id for r in replies}
        assert len(published) >= 11  # the duplicate really reached the rollup, which counted it once
        assert {u.status for u in published if u.generation_id == crashed.generation_id} == {crashed.status}
        minutes = usage_rollup.plan_minutes(rollup, "free")
        assert sum(m["replies"] for m in minutes.values()) == 10
        assert sum(m["charged_tokens"] for m in minutes.values()) == sum(want.values())
    finally:
        await rollup.stop()
        await producer.stop()

    until = datetime.now(UTC) + timedelta(minutes=1)
    mismatches, checked = await billing.replay(settings, since, until, redis=redis_client, records=records)
    assert (mismatches, checked) == ([], 2)
    # The audit is not blind: one token more in Redis is one mismatch, named.
    await redis_client.hincrby(keys.quota_day(users[0], day), "used", 1)
    mismatches, _ = await billing.replay(settings, since, until, redis=redis_client, records=records)
    assert [(m.user_id, m.store, m.field, m.expected, m.found) for m in mismatches] == [
        (users[0], "redis", "used", want[users[0]], want[users[0]] + 1)]
    # Audited per user: the other user's days are checked and clean, this one's are not looked at.
    assert await billing.replay(settings, since, until, redis=redis_client, records=records,
                                users={users[1]}) == ([], 1)
    # A charge with no finished reply behind it (what the reaper used to do with an estimate) is named too.
    orphan = (await quota.settled(replies[1].generation_id)).usage_recorded()  # type: ignore[union-attr]
    ghost = msgspec.structs.replace(orphan, generation_id=uuid.uuid4().hex, charged_tokens=9_334)
    producer = make_producer(settings.kafka_bootstrap)
    await producer.start()
    await send(producer, topics.usage, ghost, key=ghost.user_id)
    await producer.stop()
    mismatches, _ = await billing.replay(settings, since, until, redis=redis_client, records=records)
    assert [(m.store, m.field, m.generation_id, m.expected, m.found) for m in mismatches if m.store == "replies"] \
        == [("replies", "charged, no reply", ghost.generation_id, 0, 9_334)]


async def _usage(settings: Settings) -> list[UsageRecorded]:
    usage = Topics(settings.topic_prefix).usage
    return [e async for e in replay(settings.kafka_bootstrap, usage, 0, (UsageRecorded,))]  # type: ignore[misc]
