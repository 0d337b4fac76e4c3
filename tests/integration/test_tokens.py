"""API tokens against two real gateways (Cassandra, Redis): a token made, listed without its secret, and
revoked through one gateway stops working on the next request at the other, which had it cached; one revoked
by `parley token revoke` too; an expired token is a 401 (one made before expiries existed too, after the
configured life), and a cached one is not served past its expiry."""
from __future__ import annotations

import asyncio
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pytest

from infra.config.settings import Settings
from infra.stores.accounts import Accounts, hash_token
from infra.stores.session import AsyncSession
from infra.stores.tokens_cli import _list, _revoke
from tests.integration.gateway_server import serve


@pytest.fixture
def gateways(settings: Settings, tmp_path: Path) -> Iterator[tuple[str, str, Settings]]:
    gw_settings = settings.with_(state_dir=tmp_path)
    with serve(gw_settings) as a, serve(gw_settings) as b:
        yield a, b, gw_settings


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


async def test_a_revoked_token_is_refused_at_once_on_every_gateway_and_listed_without_its_secret(
        gateways: tuple[str, str, Settings], db: AsyncSession) -> None:
    a, b, settings = gateways
    user, first = await Accounts(db).create_account("free")
    async with httpx.AsyncClient(timeout=30) as http:
        r = await http.post(f"{a}/v1/tokens", headers=bearer(first.token), json={"name": "script"})
        assert r.status_code == 201, r.text
        second = r.json()
        # Both tokens answer on gateway b, which now holds them in its cache.
        for token in (first.token, second["token"]):
            assert (await http.get(f"{b}/v1/tokens", headers=bearer(token))).status_code == 200
        listed = (await http.get(f"{b}/v1/tokens", headers=bearer(first.token))).json()["items"]
        assert {t["token_id"] for t in listed} == {first.token_id, second["token_id"]}
        assert all(t["status"] == "active" for t in listed)
        for secret in (first.token, second["token"]):
            assert secret not in str(listed) and hash_token(secret) not in str(listed)
        # Revoked through gateway a: the very next request at b is a 401; the other token still works there.
        r = await http.delete(f"{a}/v1/tokens/{second['token_id']}", headers=bearer(first.token))
        assert r.status_code == 204
        assert (await http.get(f"{b}/v1/tokens", headers=bearer(second["token"]))).status_code == 401
        assert (await http.get(f"{a}/v1/tokens", headers=bearer(second["token"]))).status_code == 401
        listed = (await http.get(f"{b}/v1/tokens", headers=bearer(first.token))).json()["items"]
        assert {t["token_id"]: t["status"] for t in listed} == {first.token_id: "active",
                                                                 second["token_id"]: "revoked"}
        # Someone else cannot revoke it; the operator's command can, and gateway b hears it as well.
        _, other = await Accounts(db).create_account("free")
        r = await http.delete(f"{a}/v1/tokens/{first.token_id}", headers=bearer(other.token))
        assert r.status_code == 404
        lines = await _list(settings, user.user_id)
        assert len(lines) == 2 and first.token not in "\n".join(lines)
        assert await _revoke(settings, first.token_id) is True
        assert (await http.get(f"{b}/v1/tokens", headers=bearer(first.token))).status_code == 401
        assert await _revoke(settings, "no-such-token") is False


async def test_an_expired_token_is_refused_and_a_cached_one_is_not_served_past_its_expiry(
        gateways: tuple[str, str, Settings], db: AsyncSession) -> None:
    a, b, _ = gateways
    accounts = Accounts(db)
    user, expired = await accounts.create_account("free")
    _, soon = await accounts.create_account("free")
    now = datetime.now(UTC)
    for token, at in ((expired.token, now - timedelta(seconds=1)), (soon.token, now + timedelta(seconds=2))):
        await db.execute("UPDATE api_tokens SET expires_at = ? WHERE token_hash = ?", (at, hash_token(token)))
    async with httpx.AsyncClient(timeout=30) as http:
        r = await http.get(f"{a}/v1/tokens", headers=bearer(expired.token))
        assert r.status_code == 401 and r.json()["error"]["code"] == "unauthorized"
        # A token from before tokens had an expiry (no expires_at) ends its configured life after it was made.
        for days, status in ((91, 401), (1, 200)):
            old = f"pk_old{days}{expired.token_id}"
            await db.execute("INSERT INTO api_tokens (token_hash, user_id, created_at) VALUES (?, ?, ?)",
                             (hash_token(old), user.user_id, now - timedelta(days=days)))
            assert (await http.get(f"{a}/v1/tokens", headers=bearer(old))).status_code == status, days
        assert (await http.get(f"{b}/v1/tokens", headers=bearer(soon.token))).status_code == 200  # cached at b
        await asyncio.sleep(max(0.0, (now + timedelta(seconds=2.3) - datetime.now(UTC)).total_seconds()))
        assert (await http.get(f"{b}/v1/tokens", headers=bearer(soon.token))).status_code == 401
