"""The abandoned-reply detector: which replies it checks and cancels (pure), and whom it cancels from what
Redis holds (a fake Redis with the reservations' sorted set, a fake producer). It reads no topic."""
from __future__ import annotations

from typing import Any

import pytest
from aiokafka.errors import KafkaConnectionError

from consumers.abandoned import AbandonedDetector, Watched, abandoned, oldest_admission
from infra.config.settings import Settings
from infra.stores import keys
from schemas import CancelRequested
from tests.fake_stores import FakeProducer, FakeRedis

TTL_S = 300.0  # the reservation lifetime: a reply admitted at t has the score t + TTL_S


class ReservationsRedis(FakeRedis):
    """FakeRedis with what the detector reads: the reservations' sorted set, hashes and a pipeline."""

    def __init__(self) -> None:
        super().__init__()
        self.scores: dict[str, float] = {}
        self.hashes: dict[str, dict[str, str]] = {}

    def admit(self, gid: str, at: float) -> None:
        self.scores[gid] = at + TTL_S
        self.hashes[keys.reservation(gid)] = {"conversation_id": f"c-{gid}", "user_id": "u"}

    def settle(self, gid: str) -> None:
        self.scores.pop(gid, None)

    async def zrangebyscore(self, key: str, low: str, high: float) -> list[bytes]:
        assert key == keys.reservations_by_expiry("t.")
        return [g.encode() for g, s in sorted(self.scores.items(), key=lambda kv: kv[1]) if s <= high]

    def pipeline(self, transaction: bool = True) -> FakePipeline:
        return FakePipeline(self)


class FakePipeline:
    def __init__(self, redis: ReservationsRedis) -> None:
        self.redis, self.calls = redis, []  # type: ignore[var-annotated]

    async def __aenter__(self) -> FakePipeline:
        return self

    async def __aexit__(self, *exc: object) -> None:
        return None

    def exists(self, key: str) -> None:
        self.calls.append(int(key in self.redis.values))

    def hmget(self, key: str, *fields: str) -> None:
        found = self.redis.hashes.get(key, {})
        self.calls.append([found[f].encode() if f in found else None for f in fields])

    async def execute(self) -> list[Any]:
        return self.calls


def w(gid: str, **flags: bool) -> Watched:
    return Watched(gid, f"c-{gid}", "u", flags.get("read", False), flags.get("ended", False),
                   flags.get("cancelled", False))


def test_a_reply_is_cancelled_only_when_unread_running_and_not_cancelled_yet() -> None:
    replies = [w("left"), w("read", read=True), w("done", ended=True), w("gone", cancelled=True), w("a:title")]
    assert [x.generation_id for x in abandoned(replies)] == ["left"]


def test_only_replies_admitted_a_timeout_ago_are_looked_at() -> None:
    assert oldest_admission(100.0, 30.0, TTL_S) == 70.0 + TTL_S


async def detector() -> tuple[AbandonedDetector, ReservationsRedis, FakeProducer]:
    redis = ReservationsRedis()
    d = AbandonedDetector(Settings().with_(topic_prefix="t.", reader_timeout_s=30.0, reservation_ttl_s=TTL_S),
                          redis)
    d.producer = FakeProducer()  # type: ignore[assignment]
    return d, redis, d.producer  # type: ignore[return-value]


async def test_a_reply_nobody_reads_is_cancelled_once_and_a_read_one_is_left_alone() -> None:
    d, redis, producer = await detector()
    redis.admit("left", 0.0)
    redis.admit("read", 0.0)
    redis.admit("young", 5.0)
    await redis.set(keys.reader_heartbeat("read"), "gw-1")
    assert await d.check(31.0) == ["left"]
    [(topic, event, key)] = producer.sent
    assert topic == "t.chat.control" and key == "left"
    assert isinstance(event, CancelRequested) and event.reason == "abandoned" and event.conversation_id == "c-left"
    assert event.user_id == "u"
    assert await d.check(32.0) == []  # cancelled once, though it holds its reservation until settled
    redis.settle("young")
    assert await d.check(62.0) == [] and len(producer.sent) == 1  # the reader still beats: never cancelled


async def test_a_reply_whose_finish_is_written_is_not_cancelled_while_settlement_catches_up() -> None:
    d, redis, producer = await detector()
    redis.admit("g", 0.0)
    await redis.set(keys.finished_reply("g"), "...")
    assert await d.check(31.0) == [] and producer.sent == []


async def test_another_detector_that_cancelled_first_is_not_repeated() -> None:
    d, redis, producer = await detector()
    await redis.set(keys.abandoned_cancelled("g"), "1")
    redis.admit("g", 0.0)
    assert await d.check(31.0) == [] and producer.sent == []


async def test_titles_and_summaries_have_no_reader_by_design() -> None:
    d, redis, producer = await detector()
    redis.admit("g:title", 0.0)
    assert await d.check(31.0) == [] and producer.sent == []


async def test_a_cancel_that_could_not_be_sent_is_sent_at_the_next_check() -> None:
    d, redis, producer = await detector()
    redis.admit("g", 0.0)
    sent = producer.send_and_wait

    async def kafka_down(*args: object, **kwargs: object) -> None:
        raise KafkaConnectionError("no broker")
    producer.send_and_wait = kafka_down  # type: ignore[method-assign]
    with pytest.raises(KafkaConnectionError):
        await d.check(31.0)
    assert not await redis.exists(keys.abandoned_cancelled("g"))
    producer.send_and_wait = sent  # type: ignore[method-assign]
    assert await d.check(32.0) == ["g"]
