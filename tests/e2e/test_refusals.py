"""Refusals and reads right after a reply, through the real service: a refusal after admission frees the
reservation and the running slot at once and costs nothing; the reaper charges an abandoned reservation 0;
history and the next prompt include a reply the moment its end is streamed; the list holds no empty entries."""
from __future__ import annotations

import asyncio
import time

import httpx
import openai
import pytest
import redis.asyncio as aioredis

from infra.config.plans import load_plans
from infra.config.settings import Settings
from infra.stores.quota import Quota
from schemas import new_id
from tests.e2e.client import frames, text_of
from tests.e2e.conftest import Caller, eventually
from tests.e2e.service import Service
from tests.e2e.test_chat import history, new_conversation, send
from tests.e2e.test_long_conversations import prompts_built, settled, tokenizer, usage_of

TOO_LONG = "word " * 2_100  # about 2,100 tokens: under the 32,000-character limit, over the 2,048-token window


async def assert_nothing_held_and_nothing_charged(http: httpx.AsyncClient, who: Caller) -> None:
    u = await usage_of(http, who)  # right away: no waiting for a settlement or the reaper
    assert (u["reserved"], u["running"], u["used"]) == (0, 0, 0), u


async def assert_two_replies_can_start(http: httpx.AsyncClient, who: Caller) -> list[int]:
    async def one(i: int) -> int:
        cid = await new_conversation(http, who)
        fs = await send(http, who, cid, f"Name a colour, number {i}.", max_tokens=8)
        assert fs[0].event == "message_start" and fs[-1].event == "message_end", fs[-1]
        return int(fs[-1].data["usage"]["in"] + fs[-1].data["usage"]["out"])

    return await asyncio.gather(one(1), one(2))


async def test_a_message_too_long_for_the_window_is_refused_and_frees_everything(http: httpx.AsyncClient,
                                                                                bob: Caller) -> None:
    cid = await new_conversation(http, bob)
    for _ in range(2):  # twice: before, the second refusal found both running slots still taken
        r = await http.post(f"/v1/conversations/{cid}/messages", headers=bob.headers, json={"content": TOO_LONG})
        assert r.status_code == 413, r.text
        message = r.json()["error"]["message"]
        assert "Your message alone is" in message and "Shorten it" in message, message
        await assert_nothing_held_and_nothing_charged(http, bob)
    assert await history(http, bob, cid) == []  # nothing was saved for the refused sends
    charged = await assert_two_replies_can_start(http, bob)
    assert (await settled(http, bob))["used"] == sum(charged)


async def test_openai_refusal_frees_everything_and_leaves_no_conversation(service: Service, http: httpx.AsyncClient,
                                                                          bob: Caller) -> None:
    async with openai.AsyncOpenAI(base_url=f"{service.url('gateway-a')}/v1", api_key=bob.token,
                                  max_retries=0, timeout=120) as client:
        for _ in range(2):
            with pytest.raises(openai.BadRequestError) as err:
                await client.chat.completions.create(model="large", max_tokens=16,
                                                     messages=[{"role": "user", "content": TOO_LONG}])
            assert err.value.code == "context_length_exceeded"
            await assert_nothing_held_and_nothing_charged(http, bob)
    listed = (await http.get("/v1/conversations", headers=bob.headers)).json()["items"]
    assert listed == []  # the refused calls made no conversation anyone sees
    await assert_two_replies_can_start(http, bob)


async def test_an_expired_reservation_with_no_reply_is_charged_nothing(service: Service, http: httpx.AsyncClient,
                                                                       bob: Caller) -> None:
    redis = aioredis.Redis.from_url(service.settings.redis_url)
    try:  # a request admitted and then lost (its gateway and worker died): nothing in the replies log
        plans = load_plans(Settings.from_env(service.env).plans_file)
        quota = Quota(redis, plans, scope=service.settings.topic_prefix, reservation_ttl_s=1)
        for _ in range(2):
            await quota.reserve(bob.user_id, "free", new_id(), 9_000)
    finally:
        await redis.aclose()
    assert (await usage_of(http, bob))["reserved"] > 18_000

    async def reaped():  # type: ignore[no-untyped-def]
        u = await usage_of(http, bob)
        return u if u["reserved"] == 0 else None
    usage = await eventually(reaped, 75, every=1.0)  # the service's reaper sweeps every 30 s
    assert usage and (usage["used"], usage["running"]) == (0, 0), usage  # released, never an estimate


async def test_history_and_the_next_prompt_include_a_reply_the_moment_it_ends(
        service: Service, http: httpx.AsyncClient, alice: Caller) -> None:
    began = time.time()
    cid = await new_conversation(http, alice)
    count = tokenizer(service).count
    ends, texts, questions = [], [], []
    for i in range(20):
        question = f"Tell me one fact about the number {i + 1}."
        fs = await send(http, alice, cid, question, max_tokens=24)
        end, gid = fs[-1], fs[0].data["generation_id"]
        items = await history(http, alice, cid)  # no delay at all after message_end
        reply = next(m for m in items if m["generation_id"] == gid and m["role"] == "assistant")
        assert reply["status"] in ("complete", "length"), (i, reply["status"])
        assert reply["content"] == text_of(fs) and reply["usage"]["out"] == end.data["usage"]["out"], i
        assert reply["usage"]["in"] == end.data["usage"]["in"]
        if ends:  # this prompt was built right after the previous end: it holds the previous reply
            grew = end.data["usage"]["in"] - ends[-1]["in"]
            assert grew >= count(question) + max(1, ends[-1]["out"] // 2), (i, grew, ends[-1])
        ends.append(end.data["usage"])
        texts.append(text_of(fs))
        questions.append(question)
    built = sorted(await prompts_built(service, cid, began - 5), key=lambda p: p.turn)
    decode = tokenizer(service)._tok.decode
    assert len(built) == 20
    for before, prompt in zip(texts, built[1:], strict=False):
        assert before.strip() and before.strip() in decode(prompt.prompt_token_ids), prompt.turn


async def test_the_list_after_stopped_length_cut_and_refused_sends(http: httpx.AsyncClient, alice: Caller) -> None:
    stopped = await new_conversation(http, alice)
    async with http.stream("POST", f"/v1/conversations/{stopped}/messages", headers=alice.headers,
                           json={"content": "Write a long story about a lighthouse keeper and the sea."}) as r:
        got = []
        async for f in frames(r):
            got.append(f)
            if sum(1 for g in got if g.event == "delta") == 3:
                gid = got[0].data["generation_id"]
                assert (await http.post(f"/v1/generations/{gid}/cancel", headers=alice.headers)).status_code == 202
            if f.event == "message_end":
                break
    assert got[-1].data["stop_reason"] == "stopped"
    cut = await new_conversation(http, alice)
    # ignore_eos: a sampled early end of sequence would make this an "end", not the cut under test
    fs = await send(http, alice, cut, "Count from 1 to 100, separated by commas.", max_tokens=6, ignore_eos=True)
    assert fs[-1].data["stop_reason"] == "length"
    refused = await new_conversation(http, alice)
    r = await http.post(f"/v1/conversations/{refused}/messages", headers=alice.headers, json={"content": TOO_LONG})
    assert r.status_code == 413

    async def titled():  # type: ignore[no-untyped-def]
        items = (await http.get("/v1/conversations", headers=alice.headers)).json()["items"]
        return items if {c["conversation_id"] for c in items if c["title"]} == {stopped, cut} else None
    items = await eventually(titled, 120)
    assert items, (await http.get("/v1/conversations", headers=alice.headers)).json()
    assert {c["conversation_id"] for c in items} == {stopped, cut}  # the refused one is not listed at all
    for c in items:
        replies = [m for m in await history(http, alice, c["conversation_id"]) if m["role"] == "assistant"]
        assert replies and replies[0]["content"] and replies[0]["status"] in ("stopped", "length")
