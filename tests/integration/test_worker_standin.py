"""The large pool's only replica goes away mid-reply, on real Kafka and Redis: a worker of the small pool (which
large declares compatible) stands in, joins large's consumer group and resumes the reply from its saved tokens
under a newer epoch; the reply ends once, numbered without a gap or a repeat. When a large replica announces
itself again the stand-in hands the pool back, and the next reply is the large replica's.

The large worker is stopped, not SIGKILLed (one process here): its announcement is withdrawn at once where a
killed one's expires after REPLICA_TTL_S, and the group rebalances at once where a killed member is evicted after
its session timeout. Those two waits are the fault suite's to measure. The engines are the test double."""
from __future__ import annotations

import asyncio
import time
from typing import Any

from consumers.generation.decisions import Limits
from consumers.generation.standin import StandIns
from consumers.generation.worker import GenerationWorker
from infra.config.plans import Plan
from infra.config.settings import Settings
from schemas import GenerationFinished, GenerationStarted, TokensAppended, new_id
from tests.fakes import FakeEngine
from tests.integration.worker_requests import gather_events, request, streamed
from topics import Topics
from topics.catalogue import GENERATION
from topics.clients import make_producer, tail

PLANS = {"paid": Plan("paid", 500_000, 40_000, 80_000, 2, 64, 30, "paid")}
REPLY = " ".join(f"w{i}" for i in range(80))
LIMITS = Limits("large", "fake", max_model_len=512)
WITHIN_S = 60


def _worker(settings: Settings, worker_id: str, stand_in_from: str = "") -> GenerationWorker:
    return GenerationWorker(settings, LIMITS, FakeEngine(reply=REPLY, step_delay=0.08), capacity=4,
                            worker_id=worker_id, plans=PLANS, stand_in_from=stand_in_from)  # type: ignore[arg-type]


async def _until(what: str, done: Any) -> None:
    deadline = time.monotonic() + WITHIN_S
    while not done():
        assert time.monotonic() < deadline, f"not within {WITHIN_S} s: {what}"
        await asyncio.sleep(0.1)


async def _reply(reader: Any, gid: str, events: list[Any]) -> GenerationFinished:
    deadline = time.monotonic() + 90
    while not any(isinstance(e, GenerationFinished) for e in events):
        assert time.monotonic() < deadline, [type(e).__name__ for e in events]
        await gather_events(reader, gid, events)
    return next(e for e in events if isinstance(e, GenerationFinished))


async def test_a_compatible_pool_stands_in_for_a_pool_with_no_replica_left_and_hands_it_back(
        settings: Settings, redis_client: Any) -> None:
    topics = Topics(settings.topic_prefix)
    reader = await tail(settings.kafka_bootstrap, topics.tokens)
    producer = make_producer(settings.kafka_bootstrap)
    await producer.start()
    own = _worker(settings, "large-1")
    stand_ins: list[GenerationWorker] = []

    def stand_in(pool: str) -> GenerationWorker:
        stand_ins.append(_worker(settings, f"small-1+{pool}", stand_in_from="small"))
        return stand_ins[-1]

    dead: list[Any] = []
    watch = StandIns(redis_client, {"large": topics.group(GENERATION, "large")}, stand_in, dead.append)
    runs = [asyncio.create_task(own.run()), asyncio.create_task(watch.run())]
    back = None
    try:
        await _until("large-1 announced", lambda: "large" in watch.seen)
        gid, events = new_id(), []  # type: ignore[var-annotated]
        await request(producer, topics, gid, 60)
        while streamed(events) < 5:
            await gather_events(reader, gid, events)
        assert not stand_ins  # the pool's own replica serves it while it lives

        own.stop()  # the pool's only replica goes
        gone_at, first_epoch = time.monotonic(), max(e.epoch for e in events if isinstance(e, TokensAppended))
        await runs[0]
        while not any(isinstance(e, TokensAppended) and e.epoch > first_epoch for e in events):
            assert time.monotonic() - gone_at < 90, "no stand-in resumed the reply"
            await gather_events(reader, gid, events)
        print(f"the stand-in's first tokens {time.monotonic() - gone_at:.1f} s after the replica went")
        end = await _reply(reader, gid, events)

        assert len(stand_ins) == 1 and list(watch.running) == ["large"]
        assert end.worker_id == "small-1+large" and end.pool == "large" and end.status == "length", end
        newest = max(e.epoch for e in events if isinstance(e, (GenerationStarted, TokensAppended)))
        assert newest >= 2 and end.epoch == newest  # taken over under a newer epoch, finished by its taker
        takeover = next(i for i, e in enumerate(events) if getattr(e, "epoch", 0) == newest)
        assert events[takeover].seq > 0  # resumed after the saved tokens, not from the start
        seqs = [e.seq for e in events if isinstance(e, TokensAppended)]
        assert seqs == list(range(len(seqs))), seqs  # no gap, no repeat across the hand-over
        # Resumed from what was saved: its engine was given the prompt and the saved token ids, and asked for the
        # rest of the reply's 60 tokens (the test double then starts its words again; a model continues).
        saved = [t for e in events[:takeover] if isinstance(e, TokensAppended) for t in e.token_ids]
        resumed = stand_ins[0].engine.requests[0]
        assert (resumed.prompt_token_ids, resumed.max_tokens) == (list(range(12)) + saved, 60 - len(saved))
        text = "".join(e.text for e in events if isinstance(e, TokensAppended))
        assert text == end.text and end.usage.completion_tokens == 60

        back = _worker(settings, "large-2")  # a large replica again (restarted, its engine loaded)
        runs.append(asyncio.create_task(back.run()))
        await _until("the stand-in stopped", lambda: not watch.running)
        gid, events = new_id(), []
        await request(producer, topics, gid, 10)
        end = await _reply(reader, gid, events)
        assert end.worker_id == "large-2" and end.status == "length", end  # handed back
        assert dead == []
    finally:
        own.stop()
        if back is not None:
            back.stop()
        runs[1].cancel()
        await asyncio.wait_for(asyncio.gather(*runs, return_exceptions=True), 60)
        await producer.stop()
        await reader.stop()
