"""The gateway giving up on a request it may already have put into Kafka: nothing charged, the slot given back."""
from __future__ import annotations

import asyncio
from typing import Any

import pytest
from aiokafka.errors import KafkaTimeoutError

from infra.config.settings import Settings
from infra.stores.accounts import User
from producers.gateway import submission
from producers.gateway.errors import ApiError
from schemas import GenerationQueued, MessageSubmitted
from topics import Topics


class _Relay:
    def __init__(self) -> None:
        self.subscribed: set[str] = set()

    def subscribe(self, gid: str) -> asyncio.Queue[Any]:
        self.subscribed.add(gid)
        return asyncio.Queue()

    def unsubscribe(self, gid: str, queue: Any) -> None:
        self.subscribed.discard(gid)

    async def attach(self, gid: str) -> None:
        pass


class _Quota:
    def __init__(self) -> None:
        self.released: list[tuple[str, str, str, str]] = []

    async def release(self, gid: str, reason: str, *, user_id: str = "", plan: str = "") -> int:
        self.released.append((gid, reason, user_id, plan))
        return 0


class _Producer:
    def __init__(self) -> None:
        self.sent: list[str] = []

    async def send_and_wait(self, topic: str, value: bytes, key: bytes, partition: Any = None) -> None:
        self.sent.append(topic)
        if topic.endswith("chat.requests"):
            raise KafkaTimeoutError()


class _Sealer:
    async def seal(self, event: Any) -> Any:
        return event


class _Gateway:
    def __init__(self) -> None:
        self.relay, self.quota, self.producer, self.topics = _Relay(), _Quota(), _Producer(), Topics("t.")
        self.settings, self.sealer = Settings(), _Sealer()
        self.generations = 1  # of the conversation, this one's included

    async def claim(self, gid: str, user_id: str, conversation_id: str) -> int:
        return self.generations


async def test_a_produce_that_fails_releases_the_request_and_cancels_it() -> None:
    gw = _Gateway()
    request = MessageSubmitted(generation_id="g", conversation_id="c", user_id="u", plan="free", message_id="m",
                               client_message_id="cm", content="hi")
    with pytest.raises(KafkaTimeoutError):
        await submission.submit(gw, User("u", "free"), request)  # type: ignore[arg-type]
    # Admission may still read the record: the marker keeps it from reserving; a worker is told to stop.
    assert gw.quota.released == [("g", "gateway", "u", "free")]
    assert gw.producer.sent == ["t.chat.requests", "t.chat.control"]
    assert gw.relay.subscribed == set()


async def test_a_request_queued_with_a_wait_longer_than_the_decision_deadline_is_accepted_not_503() -> None:
    # The deadline is for the stages before the queue to decide; once queued, the shown wait (here 25 s, a paid
    # plan's, past the 0.2 s deadline) is the client's to wait or cancel, and no 503 follows.
    gw = _Gateway()
    gw.settings = Settings(admission_wait_s=0.2)
    gw.producer.send_and_wait = _ok  # type: ignore[method-assign]
    queue: asyncio.Queue[Any] = asyncio.Queue()
    gw.relay.subscribe = lambda gid: queue  # type: ignore[method-assign]
    queue.put_nowait((4, GenerationQueued(generation_id="g", conversation_id="c", user_id="u", pool="large",
                                          model="L", lane="paid", position=9, estimated_wait_s=25.0)))
    request = MessageSubmitted(generation_id="g", conversation_id="c", user_id="u", plan="paid", message_id="m",
                               client_message_id="cm", content="hi")
    accepted = await submission.submit(gw, User("u", "paid"), request)  # type: ignore[arg-type]
    await asyncio.sleep(0.5)  # well past the deadline: nothing was given up
    assert [type(e).__name__ for _, e in accepted.first] == ["GenerationQueued"] and gw.quota.released == []


async def _ok(topic: str, value: bytes, key: bytes, partition: Any = None) -> None:
    return None


async def test_a_first_message_is_sent_as_one_only_when_the_conversation_had_no_generation_before() -> None:
    from schemas import decode

    for generations, first in ((1, True), (2, False)):
        gw = _Gateway()
        gw.generations = generations  # 2: a message came through another gateway first
        gw.settings = Settings(admission_wait_s=0.05)
        sent: list[bytes] = []

        async def keep(topic: str, value: bytes, key: bytes, partition: Any = None, sent: list[bytes] = sent) -> None:
            sent.append(value)

        gw.producer.send_and_wait = keep  # type: ignore[method-assign]
        request = MessageSubmitted(generation_id="g", conversation_id="c", user_id="u", plan="paid", message_id="m",
                                   client_message_id="cm", content="hi", made_unlisted=True, instructions="Be brief.")
        with pytest.raises(ApiError):  # no decision in time: 503 (what was sent is what this test reads)
            await submission.submit(gw, User("u", "paid"), request)  # type: ignore[arg-type]
        event = decode(sent[0])
        assert isinstance(event, MessageSubmitted)
        assert (event.made_unlisted, event.instructions) == ((True, "Be brief.") if first else (False, None))
