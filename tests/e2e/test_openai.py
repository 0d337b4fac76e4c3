"""The OpenAI-compatible API end to end, called with the official ``openai`` client: the same
pipeline (quota, queue, workers, persistence) answers, and the native API sees what it saved."""
from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import openai
import pytest

from tests.e2e.conftest import Caller, eventually
from tests.e2e.service import Service

QUESTION = "Name three kinds of fruit."
LONG = "Write a long story about a lighthouse keeper and the sea."


@pytest.fixture
async def client(service: Service, alice: Caller) -> AsyncIterator[openai.AsyncOpenAI]:
    async with openai.AsyncOpenAI(base_url=f"{service.url('gateway-a')}/v1", api_key=alice.token,
                                  max_retries=0, timeout=300) as c:
        yield c


async def saved(http: httpx.AsyncClient, who: Caller, completion_id: str) -> tuple[dict, list[dict]]:  # type: ignore[type-arg]
    """(the finished assistant message, every message of its conversation), found through the native API."""
    generation_id = completion_id.removeprefix("chatcmpl-")

    async def check():  # type: ignore[no-untyped-def]
        listed = await http.get("/v1/conversations", params={"source": "api"}, headers=who.headers)
        for conv in listed.json()["items"]:
            r = await http.get(f"/v1/conversations/{conv['conversation_id']}/messages", headers=who.headers)
            items = r.json()["items"]
            reply = [m for m in items if m["generation_id"] == generation_id and m["role"] == "assistant"
                     and m["status"] != "generating"]
            if reply:
                return reply[0], items
        return None

    found = await eventually(check, 60)
    assert found is not None, f"no saved reply for {completion_id}"
    return found


async def test_completion_answers_from_the_history_and_is_saved(client: openai.AsyncOpenAI,
                                                                http: httpx.AsyncClient, alice: Caller) -> None:
    served = {m.served_model_name for m in (await client.models.list()).data}  # type: ignore[attr-defined]
    resp = await client.chat.completions.create(model="large", max_tokens=32, temperature=0, messages=[
        {"role": "system", "content": "You answer in one short sentence."},
        {"role": "user", "content": "Hello!"}, {"role": "assistant", "content": "Hi! How can I help?"},
        {"role": "user", "content": QUESTION}])
    assert resp.object == "chat.completion" and resp.id.startswith("chatcmpl-")
    assert resp.model in served
    choice = resp.choices[0]
    assert choice.message.role == "assistant" and choice.message.content
    assert choice.finish_reason in ("stop", "length")
    assert resp.usage is not None and resp.usage.prompt_tokens > 0 and resp.usage.completion_tokens > 0
    assert resp.usage.total_tokens == resp.usage.prompt_tokens + resp.usage.completion_tokens
    reply, items = await saved(http, alice, resp.id)
    assert reply["content"] == choice.message.content and reply["usage"]["out"] == resp.usage.completion_tokens
    assert [(m["role"], m["content"]) for m in items] == [("user", QUESTION), ("assistant", reply["content"])]


async def test_streamed_chunks_concatenate_to_the_saved_reply(client: openai.AsyncOpenAI,
                                                              http: httpx.AsyncClient, alice: Caller) -> None:
    stream = await client.chat.completions.create(
        model="SmolLM2-135M-Instruct", messages=[{"role": "user", "content": QUESTION}], max_tokens=48,
        stream=True, stream_options={"include_usage": True})
    chunks = [c async for c in stream]
    assert chunks[0].choices[0].delta.role == "assistant"
    assert len({c.id for c in chunks}) == 1 and chunks[0].object == "chat.completion.chunk"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert text and finishes in (["stop"], ["length"])
    usage = chunks[-1].usage
    assert chunks[-1].choices == [] and usage is not None and usage.completion_tokens > 0
    reply, _ = await saved(http, alice, chunks[0].id)
    assert reply["content"] == text and reply["status"] in ("complete", "length")
    assert reply["pool"] == "large"  # the served model name means the default pool


async def test_closing_a_stream_early_cancels_the_generation(service: Service, client: openai.AsyncOpenAI,
                                                             http: httpx.AsyncClient, alice: Caller) -> None:
    stream = await client.chat.completions.create(
        model="large", messages=[{"role": "user", "content": LONG}], max_tokens=250, stream=True)
    got = 0
    async for c in stream:
        got += bool(c.choices and c.choices[0].delta.content)
        if got == 3:
            completion_id = c.id
            break
    await stream.close()
    reply, _ = await saved(http, alice, completion_id)
    assert reply["status"] == "stopped", reply
    assert 3 <= reply["usage"]["out"] < 250
    generation_id = completion_id.removeprefix("chatcmpl-")
    cancelled = f"generation {generation_id} cancelled: its OpenAI-API client left"

    async def logged():  # type: ignore[no-untyped-def]
        return cancelled in service.procs["gateway-a"].log.read_text(errors="replace")
    assert await eventually(logged, 10), "the gateway did not cancel; the abandoned-reply detector did"


async def test_errors_raise_the_openai_exceptions(service: Service, client: openai.AsyncOpenAI) -> None:
    user = [{"role": "user", "content": "hi"}]
    async with openai.AsyncOpenAI(base_url=f"{service.url('gateway-a')}/v1", api_key="nope",
                                  max_retries=0) as stranger:
        with pytest.raises(openai.AuthenticationError) as auth:
            await stranger.chat.completions.create(model="large", messages=user)  # type: ignore[arg-type]
    assert auth.value.code == "invalid_api_key"
    tool = {"type": "function", "function": {"name": "weather", "parameters": {"type": "string"}}}
    with pytest.raises(openai.BadRequestError) as tools:
        await client.chat.completions.create(model="large", messages=user, tools=[tool])  # type: ignore[arg-type,list-item]
    assert tools.value.param == "tools[0].function.parameters"  # a tool's parameters must be an object schema
    with pytest.raises(openai.BadRequestError) as n:
        await client.chat.completions.create(model="large", messages=user, n=3)  # type: ignore[arg-type]
    assert n.value.param == "n"  # more choices than the plan runs replies at once
    with pytest.raises(openai.BadRequestError) as stop:
        await client.chat.completions.create(model="large", messages=user, stop=["a", "b", "c", "d", "e"])  # type: ignore[arg-type]
    assert stop.value.param == "stop"
    with pytest.raises(openai.NotFoundError) as route:
        await client.embeddings.create(model="large", input="hi")
    assert route.value.status_code == 404 and "/v1/embeddings" in str(route.value.message)
    with pytest.raises(openai.NotFoundError) as missing:
        await client.chat.completions.create(model="gpt-9", messages=user)  # type: ignore[arg-type]
    assert missing.value.code == "model_not_found"
