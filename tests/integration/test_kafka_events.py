"""Typed events over the real broker: round trip, dead-lettering, consumer-group take-over."""
from __future__ import annotations

import asyncio

from aiokafka import TopicPartition

from infra.config.settings import Settings
from schemas import EventDeadLettered, MessageSubmitted, TokensAppended, decode, new_id
from topics import Topics
from topics.catalogue import ADMISSION, PROMPT
from topics.clients import decode_or_deadletter, make_consumer, make_producer, send


def _message(i: int = 0) -> MessageSubmitted:
    return MessageSubmitted(generation_id=new_id(), conversation_id=f"c{i}", user_id=f"u{i}", plan="paid",
                            message_id=new_id(), client_message_id=f"cm{i}", content=f"hello {i}")


async def test_typed_event_produced_and_consumed(settings: Settings) -> None:
    topics = Topics(settings.topic_prefix)
    producer = make_producer(settings.kafka_bootstrap)
    consumer = make_consumer(settings.kafka_bootstrap, topics.requests, group_id=topics.group(ADMISSION))
    await producer.start()
    await consumer.start()
    try:
        sent = _message(1)
        meta = await send(producer, topics.requests, sent, key=sent.user_id)
        record = await asyncio.wait_for(consumer.getone(), 20)
        got = await decode_or_deadletter(record, producer, topics, "admission", (MessageSubmitted,))
        assert got == sent
        assert (record.partition, record.offset) == (meta.partition, meta.offset)
        assert record.key == b"u1"
    finally:
        await consumer.stop()
        await producer.stop()


async def test_malformed_and_wrong_type_records_go_to_dead_letter(settings: Settings) -> None:
    topics = Topics(settings.topic_prefix)
    producer = make_producer(settings.kafka_bootstrap)
    consumer = make_consumer(settings.kafka_bootstrap, topics.requests, group_id=topics.group(ADMISSION))
    dead = make_consumer(settings.kafka_bootstrap, topics.deadletter, group_id=None)
    await producer.start()
    await consumer.start()
    await dead.start()
    try:
        await producer.send_and_wait(topics.requests, b"{not json", key=b"u9")
        wrong = TokensAppended(generation_id="g", conversation_id="c", user_id="u", seq=0, text="x", token_ids=[])
        await send(producer, topics.requests, wrong, key="u9")
        good = _message(2)
        await send(producer, topics.requests, good, key="u9")
        results = []
        for _ in range(3):
            record = await asyncio.wait_for(consumer.getone(), 20)
            results.append(await decode_or_deadletter(record, producer, topics, "admission", (MessageSubmitted,)))
        assert results == [None, None, good]
        letters = [decode(r.value) for r in [await asyncio.wait_for(dead.getone(), 20) for _ in range(2)]]
        assert all(isinstance(x, EventDeadLettered) for x in letters)
        assert letters[0].raw == "{not json" and letters[0].source_topic == topics.requests  # type: ignore[union-attr]
        assert "TokensAppended" in letters[1].raw  # type: ignore[union-attr]
    finally:
        await dead.stop()
        await consumer.stop()
        await producer.stop()


async def _assigned(consumer, timeout: float = 30) -> set[TopicPartition]:  # type: ignore[no-untyped-def]
    deadline = asyncio.get_running_loop().time() + timeout
    while asyncio.get_running_loop().time() < deadline:
        await consumer.getmany(timeout_ms=200)
        if consumer.assignment():
            return set(consumer.assignment())
    return set(consumer.assignment())


async def test_two_consumers_split_partitions_and_one_takes_over(settings: Settings) -> None:
    topics = Topics(settings.topic_prefix)
    group = topics.group(PROMPT)
    opts = dict(session_timeout_ms=6000, heartbeat_interval_ms=500)
    first = make_consumer(settings.kafka_bootstrap, topics.admitted, group_id=group, **opts)
    second = make_consumer(settings.kafka_bootstrap, topics.admitted, group_id=group, **opts)
    await first.start()
    await second.start()
    try:
        a, b = await asyncio.gather(_assigned(first), _assigned(second))
        for _ in range(40):  # the first join may give everything to one member; wait for the rebalance
            if a and b:
                break
            a, b = await asyncio.gather(_assigned(first, 1), _assigned(second, 1))
        assert a and b and not (a & b)
        assert len(a | b) == 6  # chat.admitted has six partitions
        await second.stop()
        for _ in range(60):
            a = await _assigned(first, 1)
            if len(a) == 6:
                break
        assert len(a) == 6, "the survivor did not take over the leaver's partitions"
    finally:
        await first.stop()
        await second.stop()
