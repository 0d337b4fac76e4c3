"""A reply that fails in the worker (its request invalid for the pool, or the engine raising mid-reply), on real
Kafka and Redis: by the time its end is on chat.tokens the reservation and the running slot are back and
nothing is charged. The engine is the test double (tests/fakes.py): what is under test is the worker's ending."""
from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

from consumers.generation.decisions import Limits
from consumers.generation.worker import GenerationWorker
from infra.config.plans import Plan
from infra.config.settings import Settings
from infra.stores import keys
from infra.stores.quota import Quota
from infra.stores.quota_outcomes import Reservation
from schemas import GenerationFinished, GenerationRequested, decode, new_id
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
                    event = decode(r.value)
                    if isinstance(event, GenerationFinished) and event.generation_id == gid:
                        return event
    finally:
        await reader.stop()
    raise TimeoutError(f"no end for {gid}")


async def test_failed_replies_free_everything_before_their_end_is_published(settings: Settings,
                                                                           redis_client: Any) -> None:
    engine = FakeEngine(reply="one two three four five six", step_delay=0.02, fail_after_steps=2)
    worker = GenerationWorker(settings, Limits("large", "fake", max_model_len=64), engine, capacity=4,
                              plans=PLANS)  # type: ignore[arg-type]
    quota = Quota(redis_client, PLANS, scope=settings.topic_prefix)
    running = asyncio.create_task(worker.run())
    producer = make_producer(settings.kafka_bootstrap)
    await producer.start()
    try:
        user = f"u-{uuid.uuid4().hex}"
        cases = {"engine": list(range(10)), "validation": list(range(80))}  # 80 tokens: over the 64-token window
        for why, prompt in cases.items():
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
            assert (snap["reserved"], snap["running"], snap["used"]) == (0, 0, 0), (why, snap)
            marker = await quota.settled(gid)
            assert marker is not None and marker.charged == 0 and marker.published  # exactly once, nothing to bill
            assert await redis_client.get(keys.finished_reply(gid)) is not None  # readable before its end was

    finally:
        worker.stop()
        await asyncio.wait_for(running, 30)
        await producer.stop()
