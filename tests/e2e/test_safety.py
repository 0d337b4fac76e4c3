"""The safety checks through the whole service: the input check refuses before generation, and a reply
that runs into flagged text is cut, retracted on every path (live SSE, resume, history, OpenAI API),
and charged only for the tokens made.

The end-to-end rules (``data/safety.toml``) flag "solar system" in replies; the model says it, greedily,
when asked which planet is the largest in our solar system (sampled, it may name an exoplanet instead), so
every such question is sent with temperature 0. alice is on the paid plan (hold-back 0).
"""
from __future__ import annotations

import time

import httpx
import openai
import pytest

from schemas import UsageRecorded
from tests.e2e.client import collect, text_of
from tests.e2e.conftest import Caller, eventually
from tests.e2e.service import Service
from tests.e2e.test_chat import history, new_conversation, saved_reply
from topics import Topics
from topics.replay import replay

QUESTION = "Which planet is the largest in our solar system?"
GREEDY = {"temperature": 0}
RUDE = "shut up you stupid fucking idiot"
NOTICE = "This reply was removed because it goes against the content rules."


async def _usage_record(service: Service, generation_id: str) -> UsageRecorded | None:
    async def find() -> UsageRecorded | None:
        async for r in replay(service.settings.kafka_bootstrap, Topics(service.settings.topic_prefix).usage,
                              time.time() - 600, (UsageRecorded,)):
            if isinstance(r, UsageRecorded) and r.generation_id == generation_id:
                return r
        return None
    return await eventually(find, 60, every=1.0)  # type: ignore[no-any-return]


async def test_a_flagged_message_is_refused_before_generation_and_saved_blocked(
        http: httpx.AsyncClient, bob: Caller) -> None:
    cid = await new_conversation(http, bob)
    r = await http.post(f"/v1/conversations/{cid}/messages", headers=bob.headers, json={"content": RUDE})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["code"] == "blocked" and "content rules" in error["message"]
    assert "profanity" not in error["message"] and "idiot" not in error["message"]  # names no rule, echoes nothing

    async def saved() -> list[dict] | None:  # type: ignore[type-arg]
        items = await history(http, bob, cid)
        return items or None
    [message] = await eventually(saved, 30)
    assert (message["role"], message["status"]) == ("user", "blocked")
    assert message["block"] == {"category": "profanity", "rules_version": "e2e-1"}
    assert "idiot" not in message["content"]
    usage = (await http.get("/v1/usage", headers=bob.headers)).json()
    assert (usage["used"], usage["reserved"], usage["running"]) == (0, 0, 0)  # cost nothing, reserved nothing


async def test_a_reply_that_says_flagged_text_is_retracted_everywhere(service: Service, http: httpx.AsyncClient,
                                                                      alice: Caller) -> None:
    cid = await new_conversation(http, alice)
    async with http.stream("POST", f"/v1/conversations/{cid}/messages", headers=alice.headers,
                           json={"content": QUESTION, **GREEDY}) as r:
        assert r.status_code == 200
        live = await collect(r)
    names = [f.event for f in live]
    # Hold-back 0 shows text as it comes and checks each chunk after: the start of the answer is shown; the
    # flagged words may or may not be, as the check ends before or after the flush window that would show them.
    shown = text_of(live).lower()
    answer = "the largest planet in our solar system"
    assert shown and (answer.startswith(shown) or shown.startswith(answer)), shown
    assert names[-2:] == ["retracted", "message_end"] and names.index("retracted") > max(
        i for i, n in enumerate(names) if n == "delta")
    assert live[-2].data == {"notice": NOTICE}
    end = live[-1].data
    assert end["stop_reason"] == "blocked" and 0 < end["usage"]["out"] < 20  # cut within a chunk, cap 1,024
    gid = live[0].data["generation_id"]

    reply = await saved_reply(http, alice, cid, gid)
    assert reply is not None and (reply["status"], reply["content"]) == ("blocked", NOTICE)
    assert reply["block"] == {"category": "astronomy", "rules_version": "e2e-1"}
    assert reply["usage"]["out"] == end["usage"]["out"]

    # Resume from the first event (the buffer still holds every token): the text is never replayed.
    async with http.stream("GET", f"/v1/generations/{gid}/stream",
                           headers={**alice.headers, "Last-Event-ID": str(live[0].id)}) as again:
        replayed = await collect(again)
    assert [f.event for f in replayed] == ["retracted", "message_end"]
    assert replayed[-1].data["stop_reason"] == "blocked"
    for m in await history(http, alice, cid):  # a reload of history
        assert m["role"] == "user" or "solar" not in m["content"].lower()

    record = await _usage_record(service, gid)
    assert record is not None and record.status == "blocked"
    assert (record.block_category, record.rules_version) == ("astronomy", "e2e-1")
    assert record.tokens_out == end["usage"]["out"] and record.charged_tokens == record.tokens_in + record.tokens_out


@pytest.fixture
def client(service: Service, alice: Caller) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"{service.url('gateway-a')}/v1", api_key=alice.token, max_retries=0)


async def test_openai_endpoint_ends_a_cut_reply_with_content_filter(client: openai.AsyncOpenAI) -> None:
    question = [{"role": "user", "content": QUESTION}]
    resp = await client.chat.completions.create(model="large", messages=question, temperature=0)  # type: ignore[arg-type]
    choice = resp.choices[0]
    assert choice.finish_reason == "content_filter" and choice.message.content == NOTICE
    assert 0 < resp.usage.completion_tokens < 20  # type: ignore[union-attr]

    stream = await client.chat.completions.create(model="large", messages=question, temperature=0,  # type: ignore[arg-type]
                                                  stream=True)
    chunks = [c async for c in stream]
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == ["content_filter"]

    with pytest.raises(openai.BadRequestError) as refused:
        await client.chat.completions.create(model="large", messages=[{"role": "user", "content": RUDE}])
    assert refused.value.code == "content_filter"
