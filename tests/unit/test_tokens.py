"""API tokens without services: the gateway's cache and its revocation channel, the status of a listed token,
and the /v1/tokens routes over a fake account store."""
from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

import httpx
import pytest
from fastapi import FastAPI

from infra.stores import keys
from infra.stores.accounts import Bearer, Issued, TokenInfo, TooManyTokens, User, announce_revoked, hash_token
from producers.gateway import routes_tokens
from producers.gateway.app import install_error_handlers
from producers.gateway.tokens import TokenCache

ANN = User("ann", "free")


class FakeAccounts:
    """Tokens by secret; each lookup counted; ``gate`` holds a lookup half-way (a read racing a revocation)."""

    def __init__(self) -> None:
        self.live: dict[str, tuple[str, str, datetime]] = {}  # token -> (user_id, token_id, expires)
        self.listed: dict[str, list[TokenInfo]] = {}
        self.lookups = 0
        self.gate: asyncio.Event | None = None

    def add(self, token: str, user_id: str = "ann", days: float = 90) -> str:
        token_id = f"t{len(self.live)}"
        expires = datetime.now(UTC) + timedelta(days=days)
        self.live[token] = (user_id, token_id, expires)
        self.listed.setdefault(user_id, []).insert(0, TokenInfo(token_id, None, datetime.now(UTC), expires, None))
        return token_id

    async def bearer(self, token: str) -> Bearer | None:
        self.lookups += 1
        found = self.live.get(token)
        if self.gate is not None:
            await self.gate.wait()
        if found is None or found[2] <= datetime.now(UTC):
            return None
        return Bearer(User(found[0], "free"), hash_token(token), found[2])

    async def revoke(self, user_id: str, token_id: str) -> str | None:
        for token, (owner, tid, _) in list(self.live.items()):
            if owner == user_id and tid == token_id:
                del self.live[token]
                self.listed[user_id] = [TokenInfo(t.token_id, t.name, t.created_at, t.expires_at,
                                                  datetime.now(UTC) if t.token_id == tid else t.revoked_at)
                                        for t in self.listed[user_id]]
                return hash_token(token)
        return None

    async def tokens_of(self, user_id: str) -> list[TokenInfo]:
        return list(self.listed.get(user_id, []))

    async def issue_limited(self, user_id: str, name: str | None = None, ttl_days: int | None = None) -> Issued:
        if len([t for t in self.listed.get(user_id, []) if t.revoked_at is None]) >= 3:
            raise TooManyTokens(user_id)
        token = f"pk_secret{len(self.live)}"
        token_id = self.add(token, user_id, ttl_days or 90)
        return Issued(token, token_id, self.live[token][2])


class Published:
    def __init__(self) -> None:
        self.sent: list[tuple[str, str]] = []

    async def publish(self, channel: str, message: str) -> None:
        self.sent.append((channel, message))


@pytest.fixture
def accounts() -> FakeAccounts:
    return FakeAccounts()


@pytest.fixture
def cache(accounts: FakeAccounts) -> TokenCache:
    c = TokenCache(accounts, Published())  # type: ignore[arg-type]
    c.heard_message({"type": "subscribe"})
    return c


def test_a_token_is_active_until_it_expires_or_is_revoked() -> None:
    now = datetime.now(UTC)
    assert TokenInfo("t", None, now, now + timedelta(days=1), None).status(now) == "active"
    assert TokenInfo("t", None, now, now - timedelta(seconds=1), None).status(now) == "expired"
    assert TokenInfo("t", None, now, now + timedelta(days=1), now).status(now) == "revoked"


async def test_lookups_are_cached_until_a_revocation_is_heard(cache: TokenCache, accounts: FakeAccounts) -> None:
    accounts.add("pk_a")
    assert await cache.user("pk_a") == ANN and await cache.user("pk_a") == ANN
    assert accounts.lookups == 1  # the second came from the cache
    del accounts.live["pk_a"]  # revoked by another gateway: this one still has it cached...
    assert await cache.user("pk_a") == ANN
    cache.heard_message({"type": "message", "channel": keys.tokens_revoked().encode(),
                         "data": hash_token("pk_a").encode()})  # ...until the channel tells it
    assert await cache.user("pk_a") is None


async def test_nothing_is_cached_while_revocations_cannot_be_heard(accounts: FakeAccounts) -> None:
    accounts.add("pk_a")
    cache = TokenCache(accounts, Published())  # type: ignore[arg-type]
    assert not cache.subscribed
    await cache.user("pk_a")
    await cache.user("pk_a")
    assert accounts.lookups == 2
    cache.heard_message({"type": "subscribe"})
    await cache.user("pk_a")
    await cache.user("pk_a")
    assert accounts.lookups == 3
    cache.forget_all()  # the subscription was lost: what it held is dropped
    await cache.user("pk_a")
    assert accounts.lookups == 4


async def test_a_lookup_racing_a_revocation_is_not_cached(cache: TokenCache, accounts: FakeAccounts) -> None:
    accounts.add("pk_a")
    accounts.gate = asyncio.Event()
    lookup = asyncio.create_task(cache.user("pk_a"))  # read the row before the revocation deleted it...
    await asyncio.sleep(0)
    cache.heard_message({"type": "message", "data": hash_token("pk_a").encode()})  # ...heard before it ended
    accounts.gate.set()
    assert await lookup == ANN
    accounts.gate = None
    del accounts.live["pk_a"]
    assert await cache.user("pk_a") is None  # looked up again, not served from a stale entry


async def test_a_cached_token_never_outlives_its_expiry(cache: TokenCache, accounts: FakeAccounts) -> None:
    accounts.add("pk_a", days=0.5 / 86400)  # half a second left
    assert await cache.user("pk_a") == ANN
    await asyncio.sleep(0.6)
    assert await cache.user("pk_a") is None and accounts.lookups == 2


async def test_revoking_drops_it_here_and_tells_every_gateway(cache: TokenCache, accounts: FakeAccounts) -> None:
    token_id = accounts.add("pk_a")
    await cache.user("pk_a")
    assert await cache.revoke("bob", token_id) is False  # not bob's
    assert await cache.revoke("ann", token_id) is True
    assert cache.redis.sent == [(keys.tokens_revoked(), hash_token("pk_a"))]  # type: ignore[attr-defined]
    assert await cache.user("pk_a") is None


@dataclass
class Gateway:
    accounts: FakeAccounts = field(default_factory=FakeAccounts)
    tokens: TokenCache = field(init=False)

    def __post_init__(self) -> None:
        self.tokens = TokenCache(self.accounts, Published())  # type: ignore[arg-type]
        self.tokens.heard_message({"type": "subscribe"})

    async def user_for_token(self, token: str) -> User | None:
        return await self.tokens.user(token)


@pytest.fixture
async def client() -> AsyncIterator[tuple[httpx.AsyncClient, Gateway]]:
    app, gw = FastAPI(), Gateway()
    app.state.gateway = gw
    install_error_handlers(app)
    app.include_router(routes_tokens.router)
    gw.accounts.add("pk_ann")
    gw.accounts.add("pk_bob", "bob")
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw") as http:
        yield http, gw


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


async def test_list_make_and_revoke_over_http(client: tuple[httpx.AsyncClient, Gateway]) -> None:
    http, gw = client
    r = await http.post("/v1/tokens", headers=bearer("pk_ann"), json={"name": "laptop", "expires_in_days": 7})
    assert r.status_code == 201
    made = r.json()
    assert made["token"].startswith("pk_") and made["name"] == "laptop"
    assert datetime.fromisoformat(made["expires_at"]) - datetime.now(UTC) < timedelta(days=7, minutes=1)
    listed = (await http.get("/v1/tokens", headers=bearer("pk_ann"))).json()["items"]
    assert [t["status"] for t in listed] == ["active", "active"]
    assert made["token"] not in str(listed) and hash_token(made["token"]) not in str(listed)  # no secret, no hash
    assert (await http.get("/v1/tokens", headers=bearer(made["token"]))).status_code == 200
    assert (await http.delete(f"/v1/tokens/{made['token_id']}", headers=bearer("pk_bob"))).status_code == 404
    assert (await http.delete(f"/v1/tokens/{made['token_id']}", headers=bearer("pk_ann"))).status_code == 204
    assert (await http.get("/v1/tokens", headers=bearer(made["token"]))).status_code == 401  # at once
    listed = (await http.get("/v1/tokens", headers=bearer("pk_ann"))).json()["items"]
    assert [t["status"] for t in listed] == ["revoked", "active"]


async def test_a_bad_expiry_is_a_422_and_too_many_tokens_a_409(client: tuple[httpx.AsyncClient, Gateway]) -> None:
    http, _ = client
    for days in (0, -1, 10**6, "soon"):
        r = await http.post("/v1/tokens", headers=bearer("pk_ann"), json={"expires_in_days": days})
        assert r.status_code == 422, (days, r.text)
    assert (await http.post("/v1/tokens", headers=bearer("pk_ann"), json={"name": "x" * 101})).status_code == 422
    codes = [(await http.post("/v1/tokens", headers=bearer("pk_ann"))).status_code for _ in range(3)]
    assert codes == [201, 201, 409]
    assert (await http.get("/v1/tokens")).status_code == 401


class Broadcast:
    """Redis as the revocation uses it: a publish reaches every following cache a moment later (as each gateway
    reads its channel), and each counts itself in the dropped counter; ``deaf`` caches receive it and never say."""

    def __init__(self) -> None:
        self.caches: list[TokenCache] = []
        self.deaf = 0
        self.counters: dict[str, int] = {}

    async def publish(self, channel: str, message: str) -> int:
        async def later(cache: TokenCache) -> None:
            await asyncio.sleep(0.02)
            cache.heard_message({"type": "message", "channel": channel.encode(), "data": message.encode()})

        for cache in self.caches:
            asyncio.get_running_loop().create_task(later(cache))
        return len(self.caches) + self.deaf

    async def get(self, key: str) -> bytes | None:
        return str(self.counters[key]).encode() if key in self.counters else None

    def pipeline(self, transaction: bool = True) -> Broadcast.Pipe:
        return Broadcast.Pipe(self)

    class Pipe:
        def __init__(self, redis: Broadcast) -> None:
            self.redis = redis
            self.keys: list[str] = []

        def incr(self, key: str) -> None:
            self.keys.append(key)

        def expire(self, key: str, seconds: int) -> None:
            pass

        async def execute(self) -> None:
            for key in self.keys:
                self.redis.counters[key] = self.redis.counters.get(key, 0) + 1


async def test_a_revocation_is_answered_once_every_gateway_dropped_the_token() -> None:
    redis, accounts = Broadcast(), FakeAccounts()
    gateways = [TokenCache(accounts, redis) for _ in range(3)]  # type: ignore[arg-type]
    for gw in gateways:
        gw.heard_message({"type": "subscribe"})
    redis.caches = gateways
    token_id = accounts.add("pk_a")
    for gw in gateways:
        assert await gw.user("pk_a") is not None  # cached on every gateway
    began = asyncio.get_running_loop().time()
    assert await gateways[0].revoke("ann", token_id) is True
    assert asyncio.get_running_loop().time() - began >= 0.02  # it waited for them to hear it
    assert redis.counters[keys.token_dropped(hash_token("pk_a"))] == 3
    for gw in gateways:
        assert await gw.user("pk_a") is None


async def test_a_revocation_stops_waiting_for_a_gateway_that_never_says() -> None:
    redis, accounts = Broadcast(), FakeAccounts()
    gateway = TokenCache(accounts, redis)  # type: ignore[arg-type]
    gateway.heard_message({"type": "subscribe"})
    redis.caches, redis.deaf = [gateway], 1
    began = asyncio.get_running_loop().time()
    assert await announce_revoked(redis, hash_token("pk_a"), wait_s=0.1) is False
    assert 0.1 <= asyncio.get_running_loop().time() - began < 1.0
    assert redis.counters[keys.token_dropped(hash_token("pk_a"))] == 1  # the gateway that heard it said so
