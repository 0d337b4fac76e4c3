"""The page's sessions and search through the real gateway app (Redis, Cassandra, Kafka; no model):
the cookie is a revocable session and never the token, cookie calls that change something must come
from this origin, and search finds only the caller's own words."""
from __future__ import annotations

import hashlib
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient

from infra.config.settings import Settings
from infra.stores import keys
from producers.gateway.app import create_app

ORIGIN = "http://testserver"  # the TestClient's own origin


@pytest.fixture
def app(settings: Settings) -> Iterator[TestClient]:
    app = create_app(settings.with_(session_ttl_s=600, public_url=ORIGIN), {"large": "m"})  # its Host is allowed
    with TestClient(app, client=("127.0.0.1", 5)) as c:
        yield c


def demo(app: TestClient) -> tuple[TestClient, str]:
    """A signed-in browser-like client (the app's cookie jar) and that user's API token."""
    r = app.post("/v1/session/demo", json={}, headers={"Origin": ORIGIN})
    assert r.status_code == 201, r.text
    return app, r.json()["token"]


async def test_sign_out_revokes_the_session_everywhere(app: TestClient, redis_client: Any) -> None:
    _, token = demo(app)
    session_id = app.cookies["parley_session"]
    assert session_id != token and not session_id.startswith("pk_")  # the cookie is not the API key
    stored = await redis_client.get(keys.page_session(hashlib.sha256(session_id.encode()).hexdigest()))
    assert stored is not None and await redis_client.ttl(
        keys.page_session(hashlib.sha256(session_id.encode()).hexdigest())) <= 600
    assert app.get("/v1/conversations").status_code == 200
    assert app.get("/v1/session").json()["user"]["display_name"] == "demo"

    r = app.delete("/v1/session", headers={"Origin": ORIGIN})
    assert r.status_code == 204 and "max-age=0" in r.headers["set-cookie"].lower()
    app.cookies.set("parley_session", session_id)  # a copy of the old cookie, kept by a thief
    r = app.get("/v1/conversations")
    assert r.status_code == 401 and "session has ended" in r.json()["error"]["message"]
    assert app.get("/v1/session").json()["user"] is None
    bearer = {"Authorization": f"Bearer {token}"}
    assert app.get("/v1/conversations", headers=bearer).status_code == 200  # the API token still works


def test_signing_in_with_a_token_sets_a_strict_http_only_cookie(app: TestClient) -> None:
    _, token = demo(app)
    app.cookies.clear()
    r = app.post("/v1/session", json={"token": token}, headers={"Origin": ORIGIN})
    assert r.status_code == 200
    cookie = r.headers["set-cookie"].lower()
    assert "httponly" in cookie and "samesite=strict" in cookie and "path=/" in cookie and "max-age=600" in cookie
    assert "secure" not in cookie  # plain http here; over TLS (scheme https) the cookie is Secure
    assert token.lower() not in cookie
    assert app.post("/v1/session", json={"token": "pk_wrong"}).status_code == 401


def test_a_cross_origin_post_with_the_cookie_is_refused(app: TestClient) -> None:
    demo(app)
    for headers in ({"Origin": "https://evil.example"}, {}, {"Referer": "https://evil.example/x"}):
        r = app.post("/v1/conversations", json={}, headers=headers)
        assert r.status_code == 403 and r.json()["error"]["code"] == "cross_origin", headers
    assert app.get("/v1/conversations").json()["items"] == []  # nothing was created
    assert app.post("/v1/conversations", json={}, headers={"Origin": ORIGIN}).status_code == 201
    assert app.post("/v1/conversations", json={}, headers={"Referer": f"{ORIGIN}/#/c/x"}).status_code == 201


def test_search_finds_titles_and_messages_of_the_caller_only(app: TestClient, settings: Settings) -> None:
    _, alice = demo(app)
    app.cookies.clear()
    _, bob = demo(app)
    a, b = {"Authorization": f"Bearer {alice}"}, {"Authorization": f"Bearer {bob}"}
    cid = app.post("/v1/conversations", json={"title": "Lighthouse keepers of Brittany"}, headers=a).json()
    app.post("/v1/conversations", json={"title": "Lighthouse for Bob"}, headers=b)
    r = app.get("/v1/search", params={"q": "lightho BRITT"}, headers=a)
    assert r.status_code == 200
    assert [(h["conversation_id"], h["message_id"]) for h in r.json()["items"]] == [(cid["conversation_id"], None)]
    assert app.get("/v1/search", params={"q": "bob"}, headers=a).json()["items"] == []
    assert app.get("/v1/search", params={"q": "the"}, headers=a).status_code == 422
    app.cookies.clear()
    assert app.get("/v1/search", params={"q": "lighthouse"}).status_code == 401
