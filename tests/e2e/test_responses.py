"""The Responses API through the official ``openai`` client: create, stream, background with resume on
another gateway after the first died, cancel, previous_response_id, store=false, delete."""
from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import httpx
import openai
import pytest

from tests.e2e.conftest import Caller, eventually
from tests.e2e.service import Service

LONG = "Write a long story about a lighthouse keeper and the sea."


@pytest.fixture
async def client(service: Service, alice: Caller) -> AsyncIterator[openai.AsyncOpenAI]:
    async with openai.AsyncOpenAI(base_url=f"{service.url('gateway-a')}/v1", api_key=alice.token,
                                  max_retries=0, timeout=300) as c:
        yield c


async def test_create_answers_with_output_text_and_usage(client: openai.AsyncOpenAI) -> None:
    resp = await client.responses.create(model="large", input="Name three colours.", max_output_tokens=24,
                                         instructions="Answer in one line.", temperature=0)
    assert resp.id.startswith("resp_") and resp.status in ("completed", "incomplete") and resp.output_text
    assert resp.usage is not None and resp.usage.output_tokens > 0 and resp.instructions == "Answer in one line."
    again = await client.responses.retrieve(resp.id)
    assert again.output_text == resp.output_text and again.status == resp.status


async def test_streamed_events_are_numbered_and_concatenate_to_the_output(client: openai.AsyncOpenAI) -> None:
    stream = await client.responses.create(model="large", input=[{"role": "user", "content": "Say hello."}],
                                           max_output_tokens=24, stream=True)
    events = [e async for e in stream]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert events[0].type == "response.created" and events[-1].type in ("response.completed", "response.incomplete")
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert deltas and deltas == events[-1].response.output_text  # type: ignore[union-attr]


async def test_background_resumes_on_another_gateway_after_the_first_died(service: Service,
                                                                          alice: Caller) -> None:
    victim = service.start_gateway(f"gateway-victim-{uuid.uuid4().hex[:4]}")
    async with openai.AsyncOpenAI(base_url=f"http://127.0.0.1:{victim.port}/v1", api_key=alice.token,
                                  max_retries=0, timeout=120) as a:
        created = await a.responses.create(model="large", input=LONG, max_output_tokens=120, background=True)
        assert created.status in ("queued", "in_progress") and created.background
        first = []
        async for event in await a.responses.retrieve(created.id, stream=True):
            first.append(event)
            if sum(e.type == "response.output_text.delta" for e in first) == 4:
                victim.kill()  # SIGKILL mid-reply; nobody is attached now
                break
    k = first[-1].sequence_number
    async with openai.AsyncOpenAI(base_url=f"{service.url('gateway-b')}/v1", api_key=alice.token,
                                  max_retries=0, timeout=300) as b:
        rest = [e async for e in await b.responses.retrieve(created.id, stream=True, starting_after=k)]
        final = await b.responses.retrieve(created.id)
    numbers = [e.sequence_number for e in first + rest]
    assert numbers == list(range(len(numbers))), "an event is missing or repeated"
    text = "".join(e.delta for e in first + rest if e.type == "response.output_text.delta")
    assert final.status in ("completed", "incomplete") and text == final.output_text
    assert rest[-1].type in ("response.completed", "response.incomplete")


async def test_cancel_ends_it_cancelled_with_the_partial_text(client: openai.AsyncOpenAI) -> None:
    created = await client.responses.create(model="large", input=LONG, max_output_tokens=240, background=True)

    async def started():  # type: ignore[no-untyped-def]
        r = await client.responses.retrieve(created.id)
        return r if r.output_text else None

    assert await eventually(started, 120)
    cancelled = await client.responses.cancel(created.id)
    assert cancelled.status == "cancelled" and cancelled.output_text
    assert cancelled.usage is not None and cancelled.usage.output_tokens < 240
    later = await client.responses.retrieve(created.id)
    assert later.status == "cancelled" and later.output_text == cancelled.output_text


async def test_previous_response_id_continues_the_conversation(client: openai.AsyncOpenAI) -> None:
    first = await client.responses.with_raw_response.create(
        model="large", input="My name is Zorblax. Please remember it.", max_output_tokens=24, temperature=0)
    one = first.parse()  # at once: the reply may not be saved yet, the token buffer has it
    second = await client.responses.with_raw_response.create(
        model="large", input="What is my name?", previous_response_id=one.id, max_output_tokens=24, temperature=0)
    two = second.parse()
    assert second.headers["x-conversation-id"] == first.headers["x-conversation-id"]
    assert two.previous_response_id == one.id
    # The model read the earlier turn: its prompt holds the first question and answer.
    assert two.usage.input_tokens >= one.usage.input_tokens + one.usage.output_tokens  # type: ignore[union-attr]


async def test_store_false_keeps_nothing_and_delete_forgets(client: openai.AsyncOpenAI, http: httpx.AsyncClient,
                                                            alice: Caller) -> None:
    ephemeral = await client.responses.create(model="large", input="Hi!", max_output_tokens=8, store=False)
    assert ephemeral.output_text
    with pytest.raises(openai.NotFoundError):
        await client.responses.retrieve(ephemeral.id)
    listed = await http.get("/v1/conversations", params={"source": "all"}, headers=alice.headers)
    assert listed.json()["items"] == []
    kept = await client.responses.create(model="large", input="Hi!", max_output_tokens=8)
    await client.responses.delete(kept.id)
    with pytest.raises(openai.NotFoundError):
        await client.responses.retrieve(kept.id)


async def test_unsupported_fields_are_a_400_naming_them(client: openai.AsyncOpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as tools:
        await client.responses.create(model="large", input="hi", tools=[{"type": "web_search"}])  # type: ignore[list-item]
    assert tools.value.param == "tools[0].type"  # function tools only
    with pytest.raises(openai.BadRequestError) as reasoning:
        await client.responses.create(model="large", input="hi", reasoning={"effort": "high"})
    assert reasoning.value.param == "reasoning"
