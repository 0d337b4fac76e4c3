"""Quotas on the real Redis: reserve, true up, settle exactly once, expiry and the reaper."""
from __future__ import annotations

import asyncio
import random
import time
import uuid
from dataclasses import replace
from typing import Any

from infra.config.plans import Plan
from infra.config.settings import Settings
from infra.stores import keys
from infra.stores.quota import Quota
from infra.stores.quota_outcomes import Refusal, Reservation, next_midnight
from schemas import GenerationFinished, Usage, UsageRecorded, decode
from streams.reaper import Reaper
from topics import Topics
from topics.clients import make_consumer, make_producer, send

BASE = Plan(name="free", daily_tokens=1_000_000, bucket_tokens_per_minute=6_000_000, bucket_burst=1_000_000,
            max_running=2, reply_cap=500, queue_wait_limit_s=10, lane="free")


def plan(**changes: Any) -> Plan:
    return replace(BASE, **changes)


def quota(redis: Any, free: Plan, **options: Any) -> Quota:
    scope = options.pop("scope", f"t{uuid.uuid4().hex[:8]}.")
    return Quota(redis, {"free": free}, scope=scope, **options)


def uid() -> str:
    return uuid.uuid4().hex


async def admitted(q: Quota, user: str, gen: str, prompt: int, now: float | None = None) -> Reservation:
    outcome = await q.reserve(user, "free", gen, prompt, now)
    assert isinstance(outcome, Reservation), outcome
    return outcome


async def test_fifty_concurrent_reserves_admit_exactly_the_running_cap(redis_client) -> None:  # type: ignore[no-untyped-def]
    q, user = quota(redis_client, plan()), uid()
    outcomes = await asyncio.gather(*[q.reserve(user, "free", uid(), 100) for _ in range(50)])
    assert sum(isinstance(o, Reservation) for o in outcomes) == 2
    refusals = [o for o in outcomes if isinstance(o, Refusal)]
    assert len(refusals) == 48 and {r.reason for r in refusals} == {"concurrency"}
    assert all(r.status == 429 and r.retry_after_s >= 1 for r in refusals)
    assert (await q.snapshot(user, "free"))["reserved"] == 2 * 600  # refusals reserved nothing


async def test_never_more_than_two_running_with_settles_interleaved(redis_client) -> None:  # type: ignore[no-untyped-def]
    q, user = quota(redis_client, plan()), uid()
    running, peak, samples, refusals = 0, 0, [], 0

    async def one_reply(i: int) -> int:
        nonlocal running, peak, refusals
        gen = uid()
        while isinstance(await q.reserve(user, "free", gen, 100), Refusal):
            refusals += 1
            await asyncio.sleep(random.uniform(0.001, 0.005))
        running += 1
        peak = max(peak, running)
        samples.append(await redis_client.zcard(keys.quota_running(user)))
        await asyncio.sleep(random.uniform(0.001, 0.01))
        running -= 1
        settled = await q.settle(gen, 100, i)
        assert settled is not None
        return 100 + i

    charged = await asyncio.gather(*[one_reply(i) for i in range(50)])
    assert peak == 2 and max(samples) <= 2 and refusals > 0
    snap = await q.snapshot(user, "free")
    assert (snap["running"], snap["reserved"], snap["replies"], snap["used"]) == (0, 0, 50, sum(charged))


async def test_over_budget_is_refused_with_retry_after_and_message(redis_client) -> None:  # type: ignore[no-untyped-def]
    q, user = quota(redis_client, plan(daily_tokens=5_000, reply_cap=1_000)), uid()
    now = 1_735_732_800.0  # 2025-01-01 12:00 UTC
    first = await admitted(q, user, uid(), 2_000, now)
    assert first.amount == 3_000 and first.day == "2025-01-01"
    refused = await q.reserve(user, "free", uid(), 2_000, now + 1)
    assert isinstance(refused, Refusal) and refused.reason == "daily_budget" and refused.status == 429
    assert refused.retry_after_s == next_midnight(now + 1) - int(now + 1) == 43_199
    assert refused.message.startswith("Not enough left today for a full reply: 2,000 of your 5,000 daily tokens")
    assert "00:00 UTC" in refused.message
    await q.settle(first.generation_id, 2_000, 200, now=now + 2)  # 800 of the reservation come back
    await admitted(q, user, uid(), 1_800, now + 3)  # 2,200 used + 2,800 = 5,000: fits exactly
    assert isinstance(await q.reserve(user, "free", uid(), 1, now + 4), Refusal)
    await admitted(q, user, uid(), 2_000, now + 43_200)  # a new UTC day, a new budget


async def test_bucket_refills_at_the_per_minute_rate(redis_client) -> None:  # type: ignore[no-untyped-def]
    q = quota(redis_client, plan(bucket_tokens_per_minute=600, bucket_burst=1_000, reply_cap=100, max_running=9))
    user, now = uid(), 1_735_732_800.0
    await admitted(q, user, uid(), 700, now)  # takes 800 of the 1,000 burst
    refused = await q.reserve(user, "free", uid(), 200, now)
    assert isinstance(refused, Refusal) and refused.reason == "rate_limit"
    assert refused.retry_after_s == 10  # 100 short at 10 tokens a second
    assert "600 tokens" in refused.message and "try again in 10 s" in refused.message
    assert isinstance(await q.reserve(user, "free", uid(), 200, now + 9), Refusal)
    await admitted(q, user, uid(), 200, now + 10)
    snap = await q.snapshot(user, "free", now + 10)
    assert snap["bucket"]["level"] == 0 and snap["bucket"]["full_in_s"] == 100


async def test_true_up_moves_the_reservation_to_the_real_prompt(redis_client) -> None:  # type: ignore[no-untyped-def]
    q, user, gen = quota(redis_client, plan()), uid(), uid()
    await admitted(q, user, gen, 1_000)
    assert await q.true_up(gen, 1_300) == 300
    assert await q.true_up(gen, 1_300) == 0  # a redelivered PromptBuilt changes nothing
    resv = await q.reservation(gen)
    assert resv is not None and (resv.amount, resv.prompt_tokens) == (1_800, 1_300)
    assert (await q.snapshot(user, "free"))["reserved"] == 1_800
    assert await q.true_up(gen, 900) == -400
    assert (await q.snapshot(user, "free"))["reserved"] == 1_400
    await q.settle(gen, 900, 50)
    assert await q.true_up(gen, 2_000) is None
    snap = await q.snapshot(user, "free")
    assert (snap["reserved"], snap["used"]) == (0, 950)


async def test_concurrent_duplicate_settles_charge_once(redis_client) -> None:  # type: ignore[no-untyped-def]
    q, user, gen = quota(redis_client, plan()), uid(), uid()
    await admitted(q, user, gen, 1_000)
    results = await asyncio.gather(*[q.settle(gen, 1_000, 300, status="complete") for _ in range(20)])
    winners = [r for r in results if r is not None]
    assert len(winners) == 1 and (winners[0].charged, winners[0].released) == (1_300, 200)
    snap = await q.snapshot(user, "free")
    assert (snap["used"], snap["reserved"], snap["running"], snap["replies"]) == (1_300, 0, 0, 1)
    assert [m.generation_id for m in await q.unpublished()] == [gen]
    again = await q.reserve(user, "free", gen, 1_000)  # a redelivered request after settlement
    assert isinstance(again, Reservation) and again.state == "settled"
    assert (await q.snapshot(user, "free"))["reserved"] == 0


async def test_expired_reservations_are_reaped_from_the_usage_log(settings: Settings, redis_client) -> None:  # type: ignore[no-untyped-def]
    q = quota(redis_client, plan(max_running=2), reservation_ttl_s=1, scope=settings.topic_prefix)
    user, finished_gen, lost_gen = uid(), uid(), uid()
    await admitted(q, user, finished_gen, 800)
    lost = await admitted(q, user, lost_gen, 600)
    assert isinstance(await q.reserve(user, "free", uid(), 10), Refusal)  # both slots busy
    reply = GenerationFinished(generation_id=finished_gen, conversation_id="c", user_id=user, plan="free",
                               message_id="m", status="stopped", text="", model="m", pool="small", worker_id="w",
                               usage=Usage(prompt_tokens=850, completion_tokens=40, cached_prompt_tokens=600))
    producer = make_producer(settings.kafka_bootstrap)
    await producer.start()
    await send(producer, Topics(settings.topic_prefix).replies, reply, key="c")
    await producer.stop()
    await asyncio.sleep(1.1)
    assert set(await q.expired()) == {finished_gen, lost_gen}
    # An expired slot no longer blocks the user, even before the reaper runs.
    probe = await admitted(q, user, uid(), 10)
    await q.settle(probe.generation_id, 10, 0)

    reaper = Reaper(settings, q, interval_s=0.1, outbox_grace_s=0)  # also publishes the probe's usage
    await reaper.producer.start()
    try:
        reaped = {m.generation_id: m for m in await reaper.sweep()}
        assert await reaper.sweep() == []  # nothing left: the second pass charges nothing
    finally:
        await reaper.producer.stop()
    assert (reaped[finished_gen].charged, reaped[finished_gen].status) == (890, "stopped")
    assert lost_gen not in reaped  # nothing in the log says it produced anything: released, charged 0
    marker = await q.settled(lost_gen)
    assert marker is not None and (marker.charged, marker.status, marker.published) == (0, "failed", True)
    assert lost.amount > 0 and await q.settle(lost_gen, 600, 10) is None  # a late reply changes nothing
    assert await q.settle(finished_gen, 850, 40) is None  # settlement arriving late changes nothing
    snap = await q.snapshot(user, "free")
    assert (snap["used"], snap["reserved"], snap["running"]) == (890 + 10, 0, 0)
    assert await q.expired() == [] and await q.unpublished() == []
    records = await _usage_records(settings, 2)
    assert {(r.generation_id, r.status) for r in records} == {
        (finished_gen, "stopped"), (probe.generation_id, "complete")}


async def test_release_gives_everything_back_once_and_blocks_a_late_admission(redis_client) -> None:  # type: ignore[no-untyped-def]
    q, user = quota(redis_client, plan(max_running=2, bucket_burst=5_000, bucket_tokens_per_minute=60)), uid()
    first, second = uid(), uid()
    await admitted(q, user, first, 1_000)
    await admitted(q, user, second, 1_000)
    assert isinstance(await q.reserve(user, "free", uid(), 10), Refusal)  # both slots busy
    released = await asyncio.gather(*[q.release(first, "refused") for _ in range(10)])
    assert sorted(r for r in released if r is not None) == [1_500] and released.count(None) == 9
    assert await q.settle(first, 1_000, 20) is None  # a late reply for a released request charges nothing
    snap = await q.snapshot(user, "free")
    assert (snap["used"], snap["reserved"], snap["running"]) == (0, 1_500, 1)
    assert snap["bucket"]["level"] >= 5_000 - 1_500 - 1  # the refused request's tokens are back in the bucket
    assert isinstance(await q.reserve(user, "free", uid(), 10), Reservation)  # its slot is free at once
    again = await q.reserve(user, "free", first, 1_000)  # a redelivered request is not admitted again
    assert isinstance(again, Reservation) and again.state == "settled"
    # The gateway gave up before admission ran: the marker alone keeps the request from being admitted.
    early = uid()
    assert await q.release(early, "gateway", user_id=user, plan="free") == 0
    late = await q.reserve(user, "free", early, 500)
    assert isinstance(late, Reservation) and late.state == "settled" and late.amount == 0
    assert (await q.snapshot(user, "free"))["used"] == 0
    assert await q.unpublished() == []  # a release charges nothing, so there is no usage to publish


async def test_charged_totals_equal_real_use_after_a_mixed_burst(redis_client) -> None:  # type: ignore[no-untyped-def]
    q, users = quota(redis_client, plan()), [uid() for _ in range(3)]
    expected = {u: 0 for u in users}

    async def reply(user: str) -> None:
        gen, prompt = uid(), random.randint(50, 2_000)
        while isinstance(await q.reserve(user, "free", gen, prompt), Refusal):
            await asyncio.sleep(0.002)
        status = random.choice(["complete", "stopped", "failed", "length"])
        out = 0 if status == "failed" else random.randint(0, 500)
        results = await asyncio.gather(*[q.settle(gen, prompt, out, status=status) for _ in range(3)])
        assert sum(r is not None for r in results) == 1
        expected[user] += prompt + out

    await asyncio.gather(*[reply(u) for u in users for _ in range(15)])
    for user in users:
        snap = await q.snapshot(user, "free")
        assert (snap["used"], snap["reserved"], snap["running"], snap["replies"]) == (expected[user], 0, 0, 15)
    assert len(await q.unpublished()) == 45


async def _usage_records(settings: Settings, at_least: int) -> list[UsageRecorded]:
    consumer = make_consumer(settings.kafka_bootstrap, Topics(settings.topic_prefix).usage, group_id=None)
    await consumer.start()
    found: list[UsageRecorded] = []
    deadline = time.monotonic() + 30
    try:
        while len(found) < at_least and time.monotonic() < deadline:
            for records in (await consumer.getmany(timeout_ms=500)).values():
                found += [e for e in (decode(r.value) for r in records) if isinstance(e, UsageRecorded)]
    finally:
        await consumer.stop()
    return found


async def test_a_finished_reply_frees_its_slot_before_settlement_and_settles_once(redis_client) -> None:  # type: ignore[no-untyped-def]
    q, user = quota(redis_client, plan(max_running=2)), uid()
    first, second, third = uid(), uid(), uid()
    await admitted(q, user, first, 10)
    await admitted(q, user, second, 10)
    assert isinstance(await q.reserve(user, "free", third, 10), Refusal)  # two running: the cap
    await q.free_slot(user, first)  # its worker is publishing its finish
    await admitted(q, user, third, 10)  # a sequential client's next request is not refused
    reserved = (await q.snapshot(user, "free"))["reserved"]
    assert reserved > 0  # the tokens stay reserved until settlement charges them
    settled = await q.settle(first, 10, 5)
    assert settled is not None and settled.charged == 15
    assert await q.settle(first, 10, 5) is None  # once
    snap = await q.snapshot(user, "free")
    assert snap["running"] == 2 and snap["used"] == 15  # second and third; first charged once
