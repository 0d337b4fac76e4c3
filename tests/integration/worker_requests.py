"""What the worker tests on real Kafka share: put one generation's request on the paid lane, gather that
generation's events from a reader of chat.tokens, and serve one reply while a test injects its fault."""
from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable
from typing import Any

from consumers.generation import appending
from consumers.generation.decisions import Limits
from consumers.generation.worker import GenerationWorker
from infra.config.plans import Plan
from infra.config.settings import Settings
from schemas import GenerationFinished, GenerationRequested, TokensAppended, decode_record, new_id
from topics import Topics
from topics.clients import make_producer, send, tail

# Called after each fetch with the events so far and a way to start one more worker into the pool.
During = Callable[[list[Any], Callable[[GenerationWorker], None]], None]


async def request(producer: Any, topics: Topics, generation_id: str, max_tokens: int) -> None:
    await send(producer, topics.generate("large", "paid"), GenerationRequested(
        generation_id=generation_id, conversation_id=f"c-{generation_id}", user_id=f"u-{uuid.uuid4().hex}",
        plan="paid", pool="large", lane="paid", prompt_token_ids=list(range(12)), max_tokens=max_tokens,
        message_id=generation_id), key=f"c-{generation_id}")


async def gather_events(reader: Any, generation_id: str, events: list[Any], timeout_ms: int = 200) -> None:
    """Append to ``events`` what one fetch brings of ``generation_id``'s events."""
    for records in (await reader.getmany(timeout_ms=timeout_ms)).values():
        events += [e for r in records if getattr(e := decode_record(r), "generation_id", None) == generation_id]


def streamed(events: list[Any]) -> int:
    """How many token chunks have been appended so far."""
    return sum(isinstance(e, TokensAppended) for e in events)


async def one_reply(settings: Settings, worker: GenerationWorker, max_tokens: int, during: During,
                    settle_s: float = 1.0, before_stop: Callable[[], None] | None = None) -> list[Any]:
    """Run ``worker``, send one request and gather its events until it finishes (90 s at most), calling
    ``during`` after each fetch; then ``settle_s`` for anything appended after the end. Every worker is
    stopped at the end (``before_stop`` runs first, to lift a fault)."""
    topics = Topics(settings.topic_prefix)
    reader = await tail(settings.kafka_bootstrap, topics.tokens)
    producer = make_producer(settings.kafka_bootstrap)
    await producer.start()
    workers, runs = [worker], [asyncio.create_task(worker.run())]

    def start(other: GenerationWorker) -> None:
        workers.append(other)
        runs.append(asyncio.create_task(other.run()))

    gid, events = new_id(), []  # type: ignore[var-annotated]
    try:
        await request(producer, topics, gid, max_tokens)
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and not any(isinstance(e, GenerationFinished) for e in events):
            await gather_events(reader, gid, events)
            during(events, start)
        await asyncio.sleep(settle_s)  # anything appended after the end
        await gather_events(reader, gid, events, 500)
    finally:
        if before_stop is not None:
            before_stop()
        for w in workers:
            w.stop()
        await asyncio.wait_for(asyncio.gather(*runs), 60)
        await producer.stop()
        await reader.stop()
    return events


PLANS = {"paid": Plan("paid", 500_000, 40_000, 80_000, 2, 64, 30, "paid")}
REPLY = " ".join(f"w{i}" for i in range(60))


def quick_renewing_worker(settings: Settings, monkeypatch: Any, worker_id: str,
                          ack_timeout_s: float) -> GenerationWorker:
    """A worker on the fake engine (60 words, 50 ms a step) whose acks time out after ``ack_timeout_s`` and
    whose producer may be renewed at once: the producer-fault tests' worker."""
    from tests.fakes import FakeEngine

    monkeypatch.setattr(appending, "ACK_TIMEOUT_S", ack_timeout_s)
    monkeypatch.setattr(appending, "PRODUCER_RENEW_GAP_S", 0.0)
    return GenerationWorker(settings, Limits("large", "fake", max_model_len=512),
                            FakeEngine(reply=REPLY, step_delay=0.05), capacity=4, worker_id=worker_id,
                            plans=PLANS)  # type: ignore[arg-type]
