"""A reply that fails in the worker, on real Kafka and Redis, by the time its end is on chat.tokens: one refused
before the engine (its request invalid for the pool) has its reservation and running slot back and costs nothing;
one the engine failed mid-reply has its slot back and is settled with what the engine read and wrote, so a
request that burns engine time is never free. The engine is the test double (tests/fakes.py): what is under test
is the worker's ending and its settlement."""
from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

from consumers.generation.decisions import Limits
from consumers.generation.worker import GenerationWorker
from consumers.settlement import Settlement
from infra.config.plans import Plan
from infra.config.settings import Settings
from infra.stores import keys
from infra.stores.quota import Quota
from infra.stores.quota_outcomes import Reservation
from schemas import GenerationFinished, GenerationRequested, UsageRecorded, decode_record, new_id
from tests.fakes import FakeEngine
from topics import Topics
from topics.clients import make_consumer, make_producer, send

PLANS = {"paid": Plan("paid", 500_000, 40_000, 80_000, 2, 64, 30, "paid")}


async def _ended(settings: Settings, gid: str, timeout: float = 60) -> GenerationFinished:
    reader = make_consumer(settings.kafka_bootstrap, Topics(settings.topic_prefix).tokens, group_id=None)
    await reader.start()
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            for records in (await reader.getmany(timeout_ms=200)).values():
                for r in records:
                    event = decode_record(r)
                    if isinstance(event, GenerationFinished) and event.generation_id == gid:
                        return event
    finally:
        await reader.stop()
    raise TimeoutError(f"no end for {gid}")


def _collector(into: list[UsageRecorded]) -> Any:
    async def record(usage: UsageRecorded) -> None:
        into.append(usage)
    return record


async def test_a_failed_reply_frees_its_slot_at_once_and_costs_what_the_engine_did(settings: Settings,
                                                                                   redis_client: Any) -> None:
    engine = FakeEngine(reply="one two three four five six", step_delay=0.02, fail_after_steps=2)
    worker = GenerationWorker(settings, Limits("large", "fake", max_model_len=64), engine, capacity=4,
                              plans=PLANS)  # type: ignore[arg-type]
    quota = Quota(redis_client, PLANS, scope=settings.topic_prefix)
    running = asyncio.create_task(worker.run())
    producer = make_producer(settings.kafka_bootstrap)
    await producer.start()
    try:
        cases = {"engine": list(range(10)), "validation": list(range(80))}  # 80 tokens: over the 64-token window
        for why, prompt in cases.items():
            user = f"u-{uuid.uuid4().hex}"  # one each: what one is charged is the other's baseline
            gid = new_id()
            assert isinstance(await quota.reserve(user, "paid", gid, 500), Reservation)
            waiting = asyncio.create_task(_ended(settings, gid))
            await asyncio.sleep(0.5)  # the reader is at the end of chat.tokens before the request goes in
            await send(producer, Topics(settings.topic_prefix).generate("large", "paid"), GenerationRequested(
                generation_id=gid, conversation_id=f"c-{gid}", user_id=user, plan="paid", pool="large",
                lane="paid", prompt_token_ids=prompt, max_tokens=16, message_id=gid), key=f"c-{gid}")
            end = await waiting
            snap = await quota.snapshot(user, "paid")  # read as soon as the end is visible
            assert end.status == "failed" and end.reason, (why, end)
            assert await redis_client.get(keys.finished_reply(gid)) is not None  # readable before its end was
            if why == "validation":  # no engine read it: everything back, nothing to bill
                assert end.usage.prompt_tokens == end.usage.completion_tokens == 0, end.usage
                assert (snap["reserved"], snap["running"], snap["used"]) == (0, 0, 0), (why, snap)
                marker = await quota.settled(gid)
                assert marker is not None and marker.charged == 0 and marker.published  # exactly once
                continue
            # The engine read the prompt and wrote two steps: the slot is free, the reservation waits for settlement.
            assert end.usage.prompt_tokens == len(prompt) and end.usage.completion_tokens > 0, end.usage
            assert snap["reserved"] >= 500 and (snap["running"], snap["used"]) == (0, 0), (why, snap)
            recorded: list[UsageRecorded] = []
            marker = await Settlement(quota, _collector(recorded)).handle(end)
            cost = end.usage.prompt_tokens + end.usage.completion_tokens
            assert marker is not None and marker.charged == cost and marker.status == "failed"
            assert [u.charged_tokens for u in recorded] == [cost]
            snap = await quota.snapshot(user, "paid")
            assert (snap["reserved"], snap["running"], snap["used"]) == (0, 0, cost), snap

    finally:
        worker.stop()
        await asyncio.wait_for(running, 30)
        await producer.stop()


async def test_a_dead_engine_stops_its_worker_and_leaves_the_reply_to_the_next_owner(settings: Settings) -> None:
    """An engine whose process died fails every request it is handed: its worker stops (to be started again
    by its supervisor) without ending the reply it held, which the group's next worker resumes and finishes."""
    dead = GenerationWorker(settings, Limits("large", "fake", max_model_len=64),
                            FakeEngine(reply="one two three four five six", step_delay=0.05, dead_after_steps=2),
                            capacity=4, plans=PLANS)  # type: ignore[arg-type]
    stopped = asyncio.create_task(dead.run())
    producer = make_producer(settings.kafka_bootstrap)
    await producer.start()
    gid = new_id()
    try:
        waiting = asyncio.create_task(_ended(settings, gid, timeout=120))
        await asyncio.sleep(0.5)
        await send(producer, Topics(settings.topic_prefix).generate("large", "paid"), GenerationRequested(
            generation_id=gid, conversation_id=f"c-{gid}", user_id="u-dead", plan="paid", pool="large",
            lane="paid", prompt_token_ids=list(range(10)), max_tokens=16, message_id=gid), key=f"c-{gid}")
        await asyncio.wait_for(stopped, 60)  # it stopped by itself
        assert isinstance(dead.engine_failure, Exception)
        assert not waiting.done()  # and ended nothing: no failed reply
        healthy = GenerationWorker(settings, Limits("large", "fake", max_model_len=64),
                                   FakeEngine(reply="one two three four five six", step_delay=0.01),
                                   capacity=4, plans=PLANS)  # type: ignore[arg-type]
        running = asyncio.create_task(healthy.run())
        try:
            end = await waiting
        finally:
            healthy.stop()
            await asyncio.wait_for(running, 60)
        assert end.status == "complete" and end.text.split()[-1] == "six", end
    finally:
        await producer.stop()
