"""The per-user cap on open streams against a real gateway (uvicorn, Kafka, Redis, Cassandra): past it a
429 with Retry-After before a replay reader opens; another user is unaffected; a closed stream frees its slot."""
from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import AsyncExitStack
from pathlib import Path

import httpx
import pytest

from infra.config.settings import Settings
from infra.stores import keys
from infra.stores.accounts import Accounts
from infra.stores.session import AsyncSession
from schemas import new_id
from tests.integration.gateway_server import serve

CAP = 3


@pytest.fixture
def gateway(settings: Settings, tmp_path: Path) -> Iterator[str]:
    with serve(settings.with_(state_dir=tmp_path, max_streams_per_user=CAP)) as url:
        yield url


async def _user_with_generations(db: AsyncSession, redis_client, count: int) -> tuple[dict[str, str], list[str]]:  # type: ignore[no-untyped-def]
    user, token = await Accounts(db).create_user("free")
    gids = [new_id() for _ in range(count)]
    for gid in gids:  # owned, as a send would have claimed it; nothing produced, so the stream just waits
        await redis_client.set(keys.generation_owner(gid), f"{user.user_id} conv-{gid}", ex=300)
    return {"Authorization": f"Bearer {token}"}, gids


async def test_open_streams_past_the_cap_are_429_and_a_closed_one_frees_its_slot(
        gateway: str, db: AsyncSession, redis_client) -> None:  # type: ignore[no-untyped-def]
    ann, gids = await _user_with_generations(db, redis_client, CAP + 2)
    bob, bob_gids = await _user_with_generations(db, redis_client, 1)
    async with httpx.AsyncClient(base_url=gateway, timeout=30) as http, AsyncExitStack() as open_streams:
        held = []
        for gid in gids[:CAP]:
            r = await open_streams.enter_async_context(http.stream("GET", f"/v1/generations/{gid}/stream",
                                                                   headers=ann))
            assert r.status_code == 200
            held.append(r)
        r = await http.get(f"/v1/generations/{gids[CAP]}/stream", headers=ann | {"Last-Event-ID": "5"})
        assert r.status_code == 429 and r.headers["retry-after"] == "5"
        assert r.json()["error"]["code"] == "too_many_streams" and f"limit is {CAP}" in r.json()["error"]["message"]
        async with http.stream("GET", f"/v1/generations/{bob_gids[0]}/stream", headers=bob) as other:
            assert other.status_code == 200  # another user is not capped by ann's streams
        await held[0].aclose()
        for _ in range(50):  # the server sees the closed connection within a moment
            async with http.stream("GET", f"/v1/generations/{gids[CAP + 1]}/stream", headers=ann) as again:
                if again.status_code == 200:
                    break
            await asyncio.sleep(0.1)
        assert again.status_code == 200
