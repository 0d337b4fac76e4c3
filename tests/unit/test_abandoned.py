"""The abandoned-reply detector: which replies it watches (pure), and whom it cancels (fake Redis, producer)."""
from __future__ import annotations

import pytest
from aiokafka.errors import KafkaConnectionError

from consumers.abandoned import AbandonedDetector, Running, observe, overdue
from infra.config.settings import Settings
from infra.stores import keys
from schemas import (
    CancelRequested,
    GenerationFinished,
    GenerationQueued,
    GenerationStarted,
    RequestRefused,
    TokensAppended,
    Usage,
)
from tests.fake_stores import FakeProducer, FakeRedis


def ids(gid: str) -> dict[str, str]:
    return {"generation_id": gid, "conversation_id": f"c-{gid}", "user_id": "u"}


def queued(gid: str) -> GenerationQueued:
    return GenerationQueued(**ids(gid), pool="large", model="m", lane="free", position=0, estimated_wait_s=0)


def test_replies_are_watched_from_queued_or_started_until_they_end() -> None:
    running: Running = {}
    observe(running, queued("a"), 10.0)
    observe(running, GenerationStarted(**ids("b"), message_id="b", model="m", pool="large", worker_id="w",
                                       first_token_at=11.0, prompt_tokens=5), 11.0)
    observe(running, queued("a:title"), 12.0)  # the service's own call: nobody reads it
    observe(running, TokensAppended(**ids("a"), seq=0, text="x", token_ids=[1]), 13.0)
    assert running == {"a": ("c-a", "u", 10.0), "b": ("c-b", "u", 11.0)}
    observe(running, GenerationFinished(**ids("a"), plan="free", message_id="a", status="complete", text="x",
                                        usage=Usage(), model="m", pool="large", worker_id="w"), 14.0)
    observe(running, RequestRefused(**ids("b"), reason="overloaded", message="busy", status=503), 15.0)
    assert running == {}


def test_only_replies_older_than_the_timeout_are_overdue() -> None:
    running: Running = {"old": ("c", "u", 0.0), "new": ("c", "u", 25.0)}
    assert overdue(running, 30.0, 30.0) == ["old"]
    assert overdue(running, 29.9, 30.0) == []


async def detector() -> tuple[AbandonedDetector, FakeRedis, FakeProducer]:
    redis = FakeRedis()
    d = AbandonedDetector(Settings().with_(topic_prefix="t.", reader_timeout_s=30.0), redis)
    d.producer = FakeProducer()  # type: ignore[assignment]
    return d, redis, d.producer  # type: ignore[return-value]


async def test_a_reply_nobody_reads_is_cancelled_once_and_a_read_one_is_left_alone() -> None:
    d, redis, producer = await detector()
    observe(d.running, queued("left"), 0.0)
    observe(d.running, queued("read"), 0.0)
    await redis.set(keys.reader_heartbeat("read"), "gw-1")
    assert await d.check(31.0) == ["left"]
    [(topic, event, key)] = producer.sent
    assert topic == "t.chat.control" and key == "left"
    assert isinstance(event, CancelRequested) and event.reason == "abandoned" and event.conversation_id == "c-left"
    assert "read" in d.running and "left" not in d.running
    assert await d.check(62.0) == []  # the reader still beats: never cancelled


async def test_another_detector_that_cancelled_first_is_not_repeated() -> None:
    d, redis, producer = await detector()
    await redis.set(keys.abandoned_cancelled("g"), "1")
    observe(d.running, queued("g"), 0.0)
    assert await d.check(31.0) == [] and producer.sent == [] and d.running == {}


async def test_a_reply_that_ends_while_its_heartbeat_is_looked_up_is_left_alone() -> None:
    d, redis, producer = await detector()
    observe(d.running, queued("g"), 0.0)

    async def exists_then_the_reply_ends(key: str) -> int:  # the stage's loop runs during the lookup
        observe(d.running, GenerationFinished(**ids("g"), plan="free", message_id="g", status="complete",
                                              text="x", usage=Usage(), model="m", pool="large", worker_id="w"), 31.0)
        return 0
    redis.exists = exists_then_the_reply_ends  # type: ignore[method-assign]
    assert await d.check(31.0) == [] and producer.sent == [] and d.running == {}


async def test_a_cancel_that_could_not_be_sent_is_sent_at_the_next_check() -> None:
    d, redis, producer = await detector()
    observe(d.running, queued("g"), 0.0)
    sent = producer.send_and_wait

    async def kafka_down(*args: object, **kwargs: object) -> None:
        raise KafkaConnectionError("no broker")
    producer.send_and_wait = kafka_down  # type: ignore[method-assign]
    with pytest.raises(KafkaConnectionError):
        await d.check(31.0)
    assert "g" in d.running and not await redis.exists(keys.abandoned_cancelled("g"))
    producer.send_and_wait = sent  # type: ignore[method-assign]
    assert await d.check(32.0) == ["g"] and d.running == {}
