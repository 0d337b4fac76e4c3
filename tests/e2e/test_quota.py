"""Quotas through the real service: 2 replies at once, refusals before any stream, exact settlement."""
from __future__ import annotations

import asyncio

import httpx
import redis.asyncio as aioredis

from infra.config.plans import load_plans
from infra.config.settings import Settings
from infra.stores.quota import Quota
from schemas import new_id
from tests.e2e.client import collect
from tests.e2e.conftest import Caller, eventually
from tests.e2e.service import Service
from tests.e2e.test_chat import history, new_conversation


async def _usage(http: httpx.AsyncClient, who: Caller) -> dict:  # type: ignore[type-arg]
    r = await http.get("/v1/usage", headers=who.headers)
    assert r.status_code == 200, r.text
    return r.json()


async def test_at_most_two_replies_at_once_and_everything_settles(http: httpx.AsyncClient, alice: Caller) -> None:
    cid = await new_conversation(http, alice)

    async def one(i: int) -> tuple[int, object]:
        body = {"content": f"Write a long poem about the number {i}."}
        async with http.stream("POST", f"/v1/conversations/{cid}/messages", headers=alice.headers, json=body) as r:
            if r.status_code != 200:
                return r.status_code, (await r.aread(), r.headers.get("retry-after"))
            return 200, await collect(r)

    results = await asyncio.gather(*(one(i) for i in range(6)))
    accepted = [body for status, body in results if status == 200]
    refused = [body for status, body in results if status == 429]
    assert len(accepted) == 2 and len(refused) == 4, [s for s, _ in results]
    for raw, retry_after in refused:  # type: ignore[misc]
        assert retry_after is not None and int(retry_after) >= 1
        assert b"2 replies" in raw or b"at once" in raw, raw
    # every reply finished: the running slots are free again and nothing stays reserved
    async def settled():  # type: ignore[no-untyped-def]
        u = await _usage(http, alice)
        return u if u["running"] == 0 and u["reserved"] == 0 else None
    usage = await eventually(settled, 60)
    assert usage, await _usage(http, alice)
    out = sum(f[-1].data["usage"]["out"] + f[-1].data["usage"]["in"] for f in accepted)  # type: ignore[index]
    assert usage["used"] == out  # charged exactly the real tokens, in + out


async def test_over_budget_is_refused_before_any_stream(service: Service, http: httpx.AsyncClient,
                                                         bob: Caller) -> None:
    redis = aioredis.Redis.from_url(service.settings.redis_url)
    try:
        plans = load_plans(Settings.from_env(service.env).plans_file)
        quota = Quota(redis, plans, scope=service.settings.topic_prefix)
        gid = new_id()
        budget = plans["free"].daily_tokens
        await quota.reserve(bob.user_id, "free", gid, 10)
        await quota.settle(gid, budget - 20, 0)  # the day's budget is spent
    finally:
        await redis.aclose()
    cid = await new_conversation(http, bob)
    r = await http.post(f"/v1/conversations/{cid}/messages", headers=bob.headers, json={"content": "hi"})
    assert r.status_code == 429
    assert int(r.headers["retry-after"]) >= 1
    message = r.json()["error"]["message"]
    assert "30,000" in message and "UTC" in message, message
    assert [m for m in await history(http, bob, cid)] == []  # nothing was generated or saved
