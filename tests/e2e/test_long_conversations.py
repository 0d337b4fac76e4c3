"""Conversations longer than the model's window, through the real service: every turn answered, every prompt
inside the pool's window, older turns summarised by the small pool, and the bill equal to the replies' usage."""
from __future__ import annotations

import time

import httpx
import openai
import pytest
import redis.asyncio as aioredis

from infra.stores import keys
from schemas import PromptBuilt
from tests.e2e.conftest import ARTIFACTS, Caller, eventually
from tests.e2e.service import Service
from tests.e2e.test_chat import new_conversation, send
from topics import Topics
from topics.replay import replay

WINDOW = 2048  # max_model_len of both pools (infra/config/pools.toml)
TURNS = 40
REPLY_CAP = 16  # short replies keep 40 turns within a few minutes on a CPU; long messages fill the window
TOPICS = ["lighthouses", "bread", "sailing ships", "coral reefs", "whales", "harbours", "gardens", "bridges"]


def long_message(turn: int) -> str:
    """About 130 tokens: a paragraph with a fact to remember, then a question."""
    topic = TOPICS[turn % len(TOPICS)]
    facts = " ".join(f"Fact {turn}.{i}: the {topic} log for day {turn * 7 + i} lists {i * 13 + turn} sightings "
                     f"near the northern pier." for i in range(5))
    return f"Turn {turn}. My notes on {topic}: {facts} Briefly, what do these notes say about {topic}?"


async def usage_of(http: httpx.AsyncClient, who: Caller) -> dict:  # type: ignore[type-arg]
    r = await http.get("/v1/usage", headers=who.headers)
    assert r.status_code == 200, r.text
    return r.json()


async def settled(http: httpx.AsyncClient, who: Caller) -> dict:  # type: ignore[type-arg]
    """/v1/usage once nothing is reserved or running (settlement has caught up)."""
    async def check():  # type: ignore[no-untyped-def]
        u = await usage_of(http, who)
        return u if u["reserved"] == 0 and u["running"] == 0 else None
    found = await eventually(check, 60)
    assert found, await usage_of(http, who)
    return found


def tokenizer(service: Service):  # type: ignore[no-untyped-def]
    from consumers.prompt.tokenizer import tokenizer_for
    from infra.config.pools import default_model_dir

    return tokenizer_for(str(default_model_dir(service.settings)))


async def prompts_built(service: Service, conversation_id: str, since: float) -> list[PromptBuilt]:
    return [p for p in await prompts_built_any(service, since) if p.conversation_id == conversation_id]


async def prompts_built_any(service: Service, since: float) -> list[PromptBuilt]:
    """Every PromptBuilt since ``since``, opened with the service's keys (the ids travel sealed on Kafka)."""
    from infra.stores.sealing import configured
    from infra.stores.session import AsyncSession, connect

    topic = Topics(service.settings.topic_prefix).prompts
    events = [e async for e in replay(service.settings.kafka_bootstrap, topic, since, (PromptBuilt,))]
    cluster, session = connect(service.settings)
    try:
        sealer = configured(service.settings, AsyncSession(session))
        opened = [await sealer.open(e) for e in events]
    finally:
        cluster.shutdown()
    assert all(isinstance(p.prompt_token_ids, list) for p in opened)
    return opened  # type: ignore[return-value]


async def one_turn(http: httpx.AsyncClient, alice: Caller, cid: str, turn: int, ins: list[int],
                   outs: list[int]) -> None:
    fs = await send(http, alice, cid, long_message(turn), max_tokens=REPLY_CAP)
    end = fs[-1]
    assert end.event == "message_end", (turn, fs[-1])
    assert end.data["stop_reason"] in ("end", "length"), (turn, end.data)
    used_in, used_out = end.data["usage"]["in"], end.data["usage"]["out"]
    assert 0 < used_out <= REPLY_CAP and used_in + REPLY_CAP <= WINDOW, (turn, end.data["usage"])
    ins.append(used_in)
    outs.append(used_out)


async def summary_written(service: Service, conversation_id: str) -> None:
    """Once no summary of the conversation is being written (the prompt stage's one-at-a-time mark is gone)."""
    redis = aioredis.Redis.from_url(service.settings.redis_url)
    try:
        async def idle():  # type: ignore[no-untyped-def]
            return not await redis.exists(keys.summary_requested(conversation_id))
        assert await eventually(idle, 120), "a summary was still being written after 120 s"
    finally:
        await redis.aclose()


@pytest.mark.timeout(1200)
async def test_forty_turns_past_the_window(service: Service, http: httpx.AsyncClient, alice: Caller) -> None:
    began = time.time()
    cid = await new_conversation(http, alice)
    ins: list[int] = []
    outs: list[int] = []
    for turn in range(TURNS):
        await one_turn(http, alice, cid, turn, ins, outs)
    count = tokenizer(service).count
    conversation = sum(count(long_message(t)) for t in range(TURNS)) + sum(outs)
    assert conversation > 2.5 * WINDOW  # the conversation really is several windows long

    built = await prompts_built(service, cid, began - 5)
    assert len(built) == TURNS and all(len(p.prompt_token_ids) + p.max_tokens <= WINDOW for p in built)
    assert min(p.turns_kept for p in built[-10:]) < 20  # older turns did fall out
    # A summary stands in only for turns it (nearly) covers, and the small pool writes one at a time while the
    # large one answers: a scripted client that sends the next turn the moment a reply ends can outrun it (a fast
    # machine did: 40 turns in 70 s, none summarised in time). A person reads the reply first; so does this
    # client, for at most three more turns: it waits until no summary is being written, then sends.
    for turn in range(TURNS, TURNS + 3):
        if any(p.summary_used for p in built):
            break
        await summary_written(service, cid)
        await one_turn(http, alice, cid, turn, ins, outs)
        built = await prompts_built(service, cid, began - 5)
    summarised = [p for p in built if p.summary_used]
    assert summarised, "no prompt used a summary of the turns that fell out"

    usage = await settled(http, alice)
    assert usage["used"] == sum(ins) + sum(outs)  # summaries and titles are the service's own, never charged
    figures = (f"40-turn figures: turns {TURNS}, longest prompt {max(ins)} of a {WINDOW}-token window "
          f"(reply cap {REPLY_CAP}), conversation {conversation} tokens, prompts using a summary "
          f"{len(summarised)} of {len(built)} (first at turn {summarised[0].turn}), charged {usage['used']} = sum "
          f"of usage {sum(ins) + sum(outs)}, {time.time() - began:.0f} s")
    print("\n" + figures)
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    (ARTIFACTS / "forty-turns.txt").write_text(figures + "\n")


async def test_openai_keeps_the_newest_turns_of_a_long_client_history(service: Service, http: httpx.AsyncClient,
                                                                     alice: Caller) -> None:
    began = time.time()
    history: list[dict[str, str]] = [{"role": "system", "content": "You answer briefly."}]
    for turn in range(24):
        history += [{"role": "user", "content": long_message(turn)},
                    {"role": "assistant", "content": f"Noted: turn {turn} is about {TOPICS[turn % len(TOPICS)]}."}]
    history.append({"role": "user", "content": "Which topic did my last note cover?"})
    async with openai.AsyncOpenAI(base_url=f"{service.url('gateway-a')}/v1", api_key=alice.token,
                                  max_retries=0, timeout=300) as client:
        resp = await client.chat.completions.create(model="large", max_tokens=24, temperature=0,
                                                    messages=history)  # type: ignore[arg-type]
    assert resp.choices[0].message.content and resp.usage is not None
    assert resp.usage.prompt_tokens + 24 <= WINDOW
    assert resp.usage.prompt_tokens > WINDOW // 2  # it kept as much history as fits, not just the question
    gid = resp.id.removeprefix("chatcmpl-")
    built = [p for p in await prompts_built_any(service, began - 5) if p.generation_id == gid]
    assert len(built) == 1 and 1 < built[0].turns_kept < len(history) - 1  # the newest turns, not all
    usage = await settled(http, alice)
    assert usage["used"] == resp.usage.prompt_tokens + resp.usage.completion_tokens

