"""The same typed events through a faust agent: decode with the shared codec, emit a typed event."""
from __future__ import annotations

import asyncio

from infra.config.settings import Settings
from schemas import EventDeadLettered, GenerationFinished, RequestAdmitted, Usage, decode, new_id
from streams.app import make_app, topic
from topics import Topics
from topics.catalogue import ADMITTED, PERSISTENCE, REPLIES, SETTLEMENT
from topics.clients import make_consumer, make_producer, send


def finished_reply() -> GenerationFinished:
    return GenerationFinished(generation_id=new_id(), conversation_id="c", user_id="u", plan="free", message_id="m",
                              status="complete", text="hi", usage=Usage(prompt_tokens=3), model="SmolLM2",
                              pool="small", worker_id="w")


async def test_faust_agent_reads_and_writes_typed_events(settings: Settings) -> None:
    topics = Topics(settings.topic_prefix)
    app = make_app(PERSISTENCE, settings)  # a stage name: its id is the prefixed group
    replies = topic(app, topics, REPLIES)
    out = topic(app, topics, ADMITTED)
    seen: list[GenerationFinished] = []

    @app.agent(replies)
    async def echo(stream):  # type: ignore[no-untyped-def]
        async for event in stream:
            seen.append(event)
            await out.send(key=event.conversation_id.encode(), value=RequestAdmitted(
                generation_id=event.generation_id, conversation_id=event.conversation_id, user_id=event.user_id,
                plan=event.plan, message_id=event.message_id, client_message_id="x", content="",
                pool=event.pool, reply_cap=1, reserved_tokens=1))

    producer = make_producer(settings.kafka_bootstrap)
    reader = make_consumer(settings.kafka_bootstrap, topics.admitted, group_id=None)
    await producer.start()
    await reader.start()
    await app.start()
    try:
        finished = finished_reply()
        await send(producer, topics.replies, finished, key="c")
        record = await asyncio.wait_for(reader.getone(), 60)
        emitted = decode(record.value)
        assert isinstance(emitted, RequestAdmitted) and emitted.generation_id == finished.generation_id
        assert seen == [finished] and isinstance(seen[0], GenerationFinished)
    finally:
        await app.stop()
        await reader.stop()
        await producer.stop()


async def test_faust_agent_dead_letters_an_undecodable_record_and_goes_on(settings: Settings) -> None:
    topics = Topics(settings.topic_prefix)
    app = make_app(SETTLEMENT, settings)
    seen: list[GenerationFinished] = []

    @app.agent(topic(app, topics, REPLIES))
    async def collect(stream):  # type: ignore[no-untyped-def]
        async for event in stream:
            seen.append(event)

    producer = make_producer(settings.kafka_bootstrap)
    dead = make_consumer(settings.kafka_bootstrap, topics.deadletter, group_id=None)
    await producer.start()
    await dead.start()
    await app.start()
    try:
        await producer.send_and_wait(topics.replies, b'{"type": "GenerationFinished", "v": 1, "oops"', key=b"c")
        good = finished_reply()
        await send(producer, topics.replies, good, key="c")
        record = await asyncio.wait_for(dead.getone(), 60)
        lettered = decode(record.value)
        assert isinstance(lettered, EventDeadLettered)
        assert lettered.source_topic == topics.replies and lettered.raw.startswith('{"type": "GenerationFinished"')
        assert lettered.consumer_group == app.conf.id and lettered.error
        for _ in range(300):  # the agent is still alive: the good record behind the bad one arrives
            if seen:
                break
            await asyncio.sleep(0.1)
        assert seen == [good]
    finally:
        await app.stop()
        await dead.stop()
        await producer.stop()
