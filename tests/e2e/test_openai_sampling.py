"""Sampling parameters through the official ``openai`` client, end to end: each one reaches vLLM and
changes what comes back, and the reply saved is the reply the client got."""
from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import httpx
import openai
import pytest

from tests.e2e.conftest import Caller
from tests.e2e.service import Service
from tests.e2e.test_openai import saved

COUNT = [{"role": "user", "content": "Count from 1 to 20, separated by commas."}]
STORY = [{"role": "user", "content": "Tell me a short story about a cat."}]


@pytest.fixture
async def client(service: Service, alice: Caller) -> AsyncIterator[openai.AsyncOpenAI]:
    async with openai.AsyncOpenAI(base_url=f"{service.url('gateway-a')}/v1", api_key=alice.token,
                                  max_retries=0, timeout=300) as c:
        yield c


async def test_the_parameter_combination_real_apps_send_succeeds_with_rate_limit_headers(
        client: openai.AsyncOpenAI) -> None:
    raw = await client.chat.completions.with_raw_response.create(
        model="large", messages=STORY, temperature=0.7, top_p=0.9, stop=["\n\n"], presence_penalty=0.1, seed=1,
        max_tokens=30)
    resp = raw.parse()
    assert resp.choices[0].message.content and resp.choices[0].finish_reason in ("stop", "length")
    assert "\n\n" not in resp.choices[0].message.content
    assert raw.headers["x-ratelimit-limit-requests"] == "2" and int(raw.headers["x-ratelimit-remaining-tokens"]) > 0
    assert raw.headers["x-ratelimit-limit-tokens"] == "80000" and raw.headers["x-ratelimit-reset-tokens"].endswith("s")


async def test_stop_cuts_the_reply_before_the_stop_string_and_it_is_not_saved(
        client: openai.AsyncOpenAI, http: httpx.AsyncClient, alice: Caller) -> None:
    full = (await client.chat.completions.create(model="large", messages=COUNT, temperature=0,
                                                 max_tokens=60)).choices[0].message.content
    assert full and "5" in full, full
    cut = full.index("5")
    resp = await client.chat.completions.create(model="large", messages=COUNT, temperature=0, max_tokens=60,
                                                stop=["5"])
    assert resp.choices[0].message.content == full[:cut] and resp.choices[0].finish_reason == "stop"
    reply, _ = await saved(http, alice, resp.id)
    assert reply["content"] == full[:cut] and reply["status"] == "complete"


async def test_the_same_seed_gives_the_same_text_and_another_seed_may_not(client: openai.AsyncOpenAI) -> None:
    async def sample(seed: int) -> str:
        r = await client.chat.completions.create(model="large", messages=STORY, temperature=0.8, seed=seed,
                                                 max_tokens=24)
        return r.choices[0].message.content or ""

    first, again = await sample(1234), await sample(1234)
    assert first and first == again
    others = {await sample(s) for s in (1, 2, 3)}
    assert others != {first}  # the seed, not greedy decoding, made them equal


async def test_n_choices_come_back_with_their_index_whole_and_streamed(client: openai.AsyncOpenAI) -> None:
    resp = await client.chat.completions.create(model="large", messages=STORY, n=2, temperature=0.9, seed=5,
                                                max_tokens=20)
    assert [c.index for c in resp.choices] == [0, 1] and all(c.message.content for c in resp.choices)
    assert resp.choices[0].message.content != resp.choices[1].message.content  # seed 5 and seed 6
    stream = await client.chat.completions.create(model="large", messages=STORY, n=2, max_tokens=12, stream=True,
                                                  stream_options={"include_usage": True})
    texts, finishes = {0: "", 1: ""}, {}
    usage = None
    async for c in stream:
        for choice in c.choices:
            texts[choice.index] += choice.delta.content or ""
            if choice.finish_reason:
                finishes[choice.index] = choice.finish_reason
        usage = c.usage or usage
    assert all(texts.values()) and set(finishes) == {0, 1}
    assert usage is not None and 2 <= usage.completion_tokens <= 2 * 12  # both choices counted


async def test_json_object_and_json_schema_replies_parse(client: openai.AsyncOpenAI) -> None:
    ask = [{"role": "user", "content": "Give the capital of France as JSON with the key city."}]
    resp = await client.chat.completions.create(model="large", messages=ask, temperature=0, max_tokens=120,
                                                response_format={"type": "json_object"})
    assert isinstance(json.loads(resp.choices[0].message.content or ""), dict)
    schema = {"type": "object", "properties": {"answer": {"type": "string", "enum": ["yes", "no"]}},
              "required": ["answer"], "additionalProperties": False}
    resp = await client.chat.completions.create(
        model="large", messages=[{"role": "user", "content": "Is Paris in France?"}], temperature=0, max_tokens=40,
        response_format={"type": "json_schema", "json_schema": {"name": "yn", "schema": schema}})
    assert json.loads(resp.choices[0].message.content or "")["answer"] in ("yes", "no")


async def test_logprobs_come_back_for_every_token_with_alternatives(client: openai.AsyncOpenAI) -> None:
    resp = await client.chat.completions.create(model="large", messages=STORY, max_tokens=8, temperature=0,
                                                logprobs=True, top_logprobs=2)
    content = resp.choices[0].logprobs.content  # type: ignore[union-attr]
    assert content and len(content) == resp.usage.completion_tokens  # type: ignore[union-attr]
    assert all(t.logprob <= 0 and len(t.top_logprobs) == 2 for t in content)
    assert "".join(t.token for t in content).strip() == (resp.choices[0].message.content or "").strip()
    assert content[0].token == content[0].top_logprobs[0].token  # greedy: the most likely token was taken


async def test_ignore_eos_and_min_tokens_make_exactly_as_many_tokens_as_asked(client: openai.AsyncOpenAI) -> None:
    hi = [{"role": "user", "content": "Say hi."}]
    resp = await client.chat.completions.create(model="large", messages=hi, max_tokens=40, temperature=0,
                                                extra_body={"ignore_eos": True, "top_k": 20, "min_p": 0.01,
                                                            "repetition_penalty": 1.05})
    assert resp.usage is not None and resp.usage.completion_tokens == 40 and resp.choices[0].finish_reason == "length"
    short = await client.chat.completions.create(model="large", messages=hi, max_tokens=40, temperature=0)
    assert short.usage is not None and short.usage.completion_tokens < 40  # without it the model stops by itself
    longer = await client.chat.completions.create(model="large", messages=hi, max_tokens=40, temperature=0,
                                                  extra_body={"min_tokens": short.usage.completion_tokens + 5})
    assert longer.usage is not None and longer.usage.completion_tokens >= short.usage.completion_tokens + 5


async def test_a_second_turn_sharing_the_prefix_reports_cached_tokens(client: openai.AsyncOpenAI) -> None:
    system = {"role": "system", "content": "You are a museum guide. " + "Speak about paintings and sculptures. " * 40}
    first_q = {"role": "user", "content": "What is the Mona Lisa?"}
    first = await client.chat.completions.create(model="large", messages=[system, first_q], max_tokens=16,
                                                 temperature=0)
    second = await client.chat.completions.create(model="large", max_tokens=16, temperature=0, messages=[
        system, first_q, {"role": "assistant", "content": first.choices[0].message.content or ""},
        {"role": "user", "content": "Who painted it?"}])
    details = second.usage.prompt_tokens_details  # type: ignore[union-attr]
    assert details is not None and details.cached_tokens and details.cached_tokens > 0
    assert details.cached_tokens < second.usage.prompt_tokens  # type: ignore[union-attr]


async def test_a_client_system_prompt_replaces_parleys(client: openai.AsyncOpenAI) -> None:
    ask = {"role": "user", "content": "Hello"}
    default = await client.chat.completions.create(model="large", messages=[ask], max_tokens=4)
    own = await client.chat.completions.create(model="large", max_tokens=4,
                                               messages=[{"role": "system", "content": "Be brief."}, ask])
    # Parley's default system prompt is about 25 tokens; "Be brief." is 3: it was not added in front.
    assert own.usage.prompt_tokens < default.usage.prompt_tokens - 10  # type: ignore[union-attr]


async def test_api_conversations_stay_out_of_the_sidebar(client: openai.AsyncOpenAI, http: httpx.AsyncClient,
                                                         alice: Caller) -> None:
    # A page conversation with no reply yet is not listed at all (no empty sidebar entries), so the sidebar
    # is checked for the API conversation's absence; the filters list it.
    raw = await client.chat.completions.with_raw_response.create(model="large", messages=STORY, max_tokens=4)
    api_conversation = raw.headers["x-conversation-id"]
    listed: list[dict] = []
    for _ in range(50):  # listed once persistence has saved the reply, a moment after the response
        listed = (await http.get("/v1/conversations", params={"source": "api"},
                                 headers=alice.headers)).json()["items"]
        if listed:
            break
        await asyncio.sleep(0.2)
    assert [c["conversation_id"] for c in listed] == [api_conversation] and listed[0]["source"] == "api"
    sidebar = (await http.get("/v1/conversations", headers=alice.headers)).json()["items"]
    assert api_conversation not in [c["conversation_id"] for c in sidebar]
    every = (await http.get("/v1/conversations", params={"source": "all"}, headers=alice.headers)).json()["items"]
    assert api_conversation in [c["conversation_id"] for c in every]


async def test_the_native_message_endpoint_takes_the_same_parameters(http: httpx.AsyncClient, alice: Caller) -> None:
    cid = (await http.post("/v1/conversations", headers=alice.headers, json={})).json()["conversation_id"]
    bad = await http.post(f"/v1/conversations/{cid}/messages", headers=alice.headers,
                          json={"content": "hi", "top_p": 7})
    assert bad.status_code == 422 and "top_p" in bad.json()["error"]["message"]
    async with http.stream("POST", f"/v1/conversations/{cid}/messages", headers=alice.headers,
                           json={"content": COUNT[0]["content"], "temperature": 0, "stop": ["5"],
                                 "max_tokens": 60}) as r:
        body = "".join([chunk async for chunk in r.aiter_text()])
    deltas = [json.loads(line[6:])["text"] for line in body.splitlines()
              if line.startswith("data: ") and '"text"' in line]
    assert deltas and "5" not in "".join(deltas) and '"stop_reason":"end"' in body
