"""A second worker joins the pool while a reply streams, on real Kafka and Redis: the rebalance hands the
reply to one owner at a time. The first worker lets go of it before the partitions move (no older-epoch token
after the new owner's first event), the new owner resumes it from its saved tokens under a newer epoch, and the
reply ends exactly once with its tokens numbered without a gap or a repeat. The engines are the test double
(tests/fakes.py): what is under test is the workers' hand-over."""
from __future__ import annotations

import asyncio
import time
from typing import Any

from consumers.generation.decisions import Limits
from consumers.generation.worker import GenerationWorker
from infra.config.plans import Plan
from infra.config.settings import Settings
from schemas import GenerationFinished, GenerationStarted, TokensAppended, new_id
from tests.fakes import FakeEngine
from tests.integration.worker_requests import gather_events, request
from topics import Topics
from topics.clients import make_consumer, make_producer

PLANS = {"paid": Plan("paid", 500_000, 40_000, 80_000, 2, 64, 30, "paid")}
REPLY = " ".join(f"w{i}" for i in range(80))


async def test_a_worker_joining_mid_reply_takes_it_over_with_one_owner_at_a_time(settings: Settings,
                                                                                redis_client: Any) -> None:
    limits = Limits("large", "fake", max_model_len=512)
    first = GenerationWorker(settings, limits, FakeEngine(reply=REPLY, step_delay=0.08), capacity=4,
                             worker_id="first", plans=PLANS)  # type: ignore[arg-type]
    second = GenerationWorker(settings, limits, FakeEngine(reply=REPLY, step_delay=0.08), capacity=4,
                              worker_id="second", plans=PLANS)  # type: ignore[arg-type]
    topics = Topics(settings.topic_prefix)
    reader = make_consumer(settings.kafka_bootstrap, topics.tokens, group_id=None, auto_offset_reset="latest")
    await reader.start()
    producer = make_producer(settings.kafka_bootstrap)
    await producer.start()
    runs = [asyncio.create_task(first.run())]
    gid, events = new_id(), []
    try:
        await asyncio.sleep(1.0)  # the reader is at the end of chat.tokens
        await request(producer, topics, gid, 60)
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and not any(isinstance(e, GenerationFinished) for e in events):
            await gather_events(reader, gid, events)
            if len(runs) == 1 and sum(isinstance(e, TokensAppended) for e in events) >= 5:
                runs.append(asyncio.create_task(second.run()))  # joins mid-reply: the group rebalances
        await asyncio.sleep(2)  # anything a second owner would still append
        await gather_events(reader, gid, events, 500)
    finally:
        first.stop()
        second.stop()
        await asyncio.wait_for(asyncio.gather(*runs), 60)
        await producer.stop()
        await reader.stop()

    ends = [e for e in events if isinstance(e, GenerationFinished)]
    assert len(ends) == 1, [type(e).__name__ for e in events]
    newest = max(e.epoch for e in events if isinstance(e, (GenerationStarted, TokensAppended)))
    assert newest >= 2 and ends[0].epoch == newest  # taken over once, finished by the owner that took it
    takeover = next(i for i, e in enumerate(events) if getattr(e, "epoch", 0) == newest)
    late = [e.seq for e in events[takeover:] if isinstance(e, TokensAppended) and e.epoch < newest]
    assert late == [], f"the old owner appended seqs {late} after the new owner began"
    assert 0 < events[takeover].seq  # resumed after the tokens saved before the hand-over, not from the start
    seqs = [e.seq for e in events if isinstance(e, TokensAppended)]
    assert seqs == list(range(len(seqs))), seqs  # numbered from 0, no gap, no repeat across the hand-over
    assert ends[0].usage.completion_tokens == sum(len(e.token_ids) for e in events if isinstance(e, TokensAppended))
