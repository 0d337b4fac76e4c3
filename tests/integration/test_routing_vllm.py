"""Conversation affinity on two real vLLM replicas: every turn of a conversation goes to the replica that served
its first, and there the engine's prefix cache holds the whole previous prompt.

A service of its own runs two workers of ``large`` (vLLM with prefix caching, as `parley up` runs them; the pool's
routing ``conversation``). Conversations are continued through the Responses API (``previous_response_id``), whose
usage says how many prompt tokens the engine found in its cache; which replica served a generation is read from
the workers' own logs. Conversations are opened until each replica has served some (at most MAX_CONVERSATIONS, of
three short turns each). The figures are printed (``-s``) and written to ``tests/artifacts/routing-vllm.txt``.
Here rather than beside the e2e files: their service's two engines are stopped by now, and a replica of vLLM's
CPU build holds about 3 GB (four more engines beside `parley up`'s starved this 24 GiB machine).
"""
from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from infra.config.settings import Settings
from tests.e2e.conftest import ARTIFACTS, _make_user
from tests.e2e.service import Service, launch

pytestmark = pytest.mark.integration

BLOCK = 128  # the prefix cache holds whole blocks, and vLLM's CPU build makes them 128 tokens long
# The first message is long and its own to each conversation from its first words, so a conversation's first
# block is found only on the replica that served it (the shared system prompt fills no block on its own).
TURNS = ("My name is {name}. My favourite numbers are {numbers}. Say hello to me.", "What is my name?",
         "Which of my numbers is the largest?")
NAMES = ("Ada", "Bruno", "Chiara", "Dmitri", "Esme", "Farid", "Greta", "Hiro", "Ines", "Jonas", "Kemal", "Lena")
MIN_CONVERSATIONS = 6
MAX_CONVERSATIONS = len(NAMES)
REPLICAS = ("worker-large", "worker-large-2")


@pytest.fixture(scope="module")
def two_replicas(stack_settings: Settings) -> Iterator[Service]:
    svc = launch(stack_settings, ARTIFACTS / "e2e-logs", pools=("large",))
    try:
        second = svc.start(REPLICAS[1], "worker", "--pool", "large", "--metrics-port", "0")
        svc.wait_log(second, "worker ready", 400)
    except BaseException:
        svc.stop()
        raise
    yield svc
    svc.stop()


async def _both_announced(settings: Settings, timeout_s: float = 120.0) -> None:
    """Until both workers announce partitions of the pool (the scheduler places on what they announce)."""
    import redis.asyncio as aioredis

    from consumers.scheduler.stage import read_announcements
    from topics import Topics
    from topics.catalogue import GENERATION

    redis = aioredis.Redis.from_url(settings.redis_url)
    try:
        group = Topics(settings.topic_prefix).group(GENERATION, "large")
        deadline = asyncio.get_running_loop().time() + timeout_s
        while True:
            announced = await read_announcements(redis, group)
            if len([a for a in announced if any(a.partitions.values())]) == 2:
                await asyncio.sleep(1.0)  # the scheduler reads them every 0.5 s
                return
            assert asyncio.get_running_loop().time() < deadline, f"not both announced: {announced}"
            await asyncio.sleep(0.5)
    finally:
        await redis.aclose()


async def _served_by(logs: list[Path], generation_id: str, timeout_s: float = 15.0) -> int:
    """Which replica's log says it served the generation (its end is logged as its finish is published)."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while True:
        found = [i for i, log in enumerate(logs) if f"generation {generation_id} " in log.read_text(errors="replace")]
        if found:
            assert len(found) == 1, f"generation {generation_id} served by both replicas"
            return found[0]
        assert asyncio.get_running_loop().time() < deadline, f"no worker log names generation {generation_id}"
        await asyncio.sleep(0.2)


@pytest.mark.timeout(900)
async def test_each_conversation_stays_on_one_replica_whose_cache_holds_its_prompt(two_replicas: Service) -> None:
    svc = two_replicas
    who = await _make_user(svc.settings, "paid")
    await _both_announced(svc.settings)
    logs = [svc.procs[name].log for name in REPLICAS]
    rows: list[tuple[int, int, int, int, int]] = []  # conversation, turn, replica, input tokens, cached
    conversations_on = [0, 0]
    async with openai.AsyncOpenAI(base_url=f"{svc.url()}/v1", api_key=who.token, max_retries=0,
                                  timeout=300) as client:
        for c, name in enumerate(NAMES):
            if c >= MIN_CONVERSATIONS and min(conversations_on) >= 1:
                break
            previous: str | None = None
            for turn, question in enumerate(TURNS):
                numbers = ", ".join(str((c * 7919 + k * 104729) % 100000) for k in range(40))
                resp = await client.responses.create(model="large", input=question.format(name=name, numbers=numbers),
                                                     previous_response_id=previous, max_output_tokens=12,
                                                     temperature=0)
                assert resp.usage is not None and resp.status in ("completed", "incomplete"), resp
                replica = await _served_by(logs, resp.id.removeprefix("resp_"))
                rows.append((c, turn, replica, resp.usage.input_tokens,
                             resp.usage.input_tokens_details.cached_tokens))
                previous = resp.id
            conversations_on[rows[-1][2]] += 1

    firsts = [r for r in rows if r[1] == 0]
    follow_ups = [r for r in rows if r[1] > 0]
    first_share = sum(r[4] for r in firsts) / sum(r[3] for r in firsts)
    follow_share = sum(r[4] for r in follow_ups) / sum(r[3] for r in follow_ups)
    report = [f"{len(firsts)} conversations of {len(TURNS)} turns on two vLLM replicas of large (routing "
              f"conversation): {conversations_on[0]} / {conversations_on[1]} conversations per replica",
              f"prompt tokens found in the engine's prefix cache: first turns {100 * first_share:.0f}%, "
              f"follow-up turns {100 * follow_share:.0f}%",
              *(f"  conversation {c} turn {t}: replica {r}, {n} prompt tokens, {k} cached" for c, t, r, n, k in rows)]
    print("\n".join(report))
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    (ARTIFACTS / "routing-vllm.txt").write_text("\n".join(report) + "\n")

    assert min(conversations_on) >= 1, f"one replica served every conversation: {conversations_on}"
    by_conversation: dict[int, set[int]] = {}
    for c, _, replica, _, _ in rows:
        by_conversation.setdefault(c, set()).add(replica)
    assert all(len(on) == 1 for on in by_conversation.values()), f"a conversation moved replica: {by_conversation}"
    # A first turn finds nothing cached (its first block is its own); each follow-up finds at least the previous
    # turn's whole prompt (its full blocks) in its replica's cache.
    assert all(cached == 0 for _, _, _, _, cached in firsts), firsts
    for (c, t, _, n, _), (c2, t2, _, _, cached) in zip(rows, rows[1:], strict=False):
        if c2 == c and t2 == t + 1:
            assert cached >= n // BLOCK * BLOCK, f"conversation {c} turn {t2}: {cached} cached of the {n} before"
