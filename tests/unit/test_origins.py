"""Trusted hosts and allowed origins come from settings, never from the request's Host (DNS rebinding)."""
from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from infra.config.settings import Settings
from infra.stores.accounts import User
from producers.gateway.app import create_app
from producers.gateway.origins import allowed_origins, host_allowed, trusted_hosts

EVIL = "http://evil.example:8000"


def client(base_url: str, **settings: object) -> TestClient:
    # No `with`: the lifespan (Kafka, Redis, Cassandra) never starts; a bad token is all these calls reach.
    app = create_app(Settings().with_(**settings), {"large": "m"})

    async def user_for_token(token: str) -> User | None:
        return None

    app.state.gateway.user_for_token = user_for_token
    return TestClient(app, base_url=base_url, client=("127.0.0.1", 50000))


def test_by_default_only_loopback_names_are_trusted_and_only_at_the_gateways_port() -> None:
    hosts = trusted_hosts(Settings())
    assert all(host_allowed(h, hosts) for h in ("localhost:8000", "127.0.0.1:8000", "[::1]:8000", "LOCALHOST"))
    assert not any(host_allowed(h, hosts) for h in ("evil.example:8000", "evil.example", "127.0.0.1.evil.example",
                                                     ""))
    origins = allowed_origins(Settings(), 8000)
    assert {"http://localhost:8000", "http://127.0.0.1:8000", "http://[::1]:8000"} <= origins
    assert "http://localhost:9" not in origins and EVIL not in origins


def test_the_public_url_and_allowed_hosts_extend_them() -> None:
    settings = Settings().with_(public_url="https://Chat.Example.com", allowed_hosts=("parley-gateway", "*.corp"))
    hosts = trusted_hosts(settings)
    assert all(host_allowed(h, hosts) for h in ("chat.example.com", "parley-gateway:80", "api.corp"))
    assert not host_allowed("evil.example", hosts)
    assert "https://chat.example.com" in allowed_origins(settings, 8000)
    assert trusted_hosts(Settings().with_(local_mode=False)) == frozenset({"*"})  # a deployment behind its LB
    assert trusted_hosts(Settings().with_(allowed_hosts=("*",))) >= {"*"}


def test_dns_rebinding_is_refused_before_any_route_runs() -> None:
    r = client(EVIL).post("/v1/session/demo", json={}, headers={"Origin": EVIL})
    assert r.status_code == 400 and r.json()["error"]["code"] == "untrusted_host"
    assert "PARLEY_PUBLIC_URL" in r.json()["error"]["message"] and "set-cookie" not in r.headers
    r = client(EVIL).get("/v1/session")
    assert r.status_code == 400 and r.json()["error"]["code"] == "untrusted_host"
    assert client(EVIL).get("/healthz").status_code == 200  # probes call it by address


@pytest.mark.parametrize("origin", [EVIL, "http://127.0.0.1:9", "http://localhost", "null"])
def test_a_trusted_host_with_a_foreign_origin_is_403(origin: str) -> None:
    r = client("http://127.0.0.1:8000").post("/v1/session", json={"token": "pk_x"}, headers={"Origin": origin})
    assert r.status_code == 403 and r.json()["error"]["code"] == "cross_origin"


@pytest.mark.parametrize(("base_url", "origin", "settings"), [
    ("http://127.0.0.1:8000", "http://127.0.0.1:8000", {}),
    ("http://localhost:8000", "http://localhost:8000", {}),
    ("https://chat.example.com", "https://chat.example.com", {"public_url": "https://chat.example.com"})])
def test_the_configured_origins_get_through_to_the_route(base_url: str, origin: str,
                                                         settings: dict[str, object]) -> None:
    r = client(base_url, **settings).post("/v1/session", json={"token": "pk_x"}, headers={"Origin": origin})
    assert r.status_code == 401 and r.json()["error"]["code"] == "unauthorized"  # past both checks


def test_a_page_reached_through_a_local_proxy_spends_its_cookie_there_and_nowhere_else() -> None:
    proxied = "http://127.0.0.1:18080"  # a proxy or load balancer on loopback in front of the gateway
    r = client(proxied).post("/v1/session", json={"token": "pk_x"}, headers={"Origin": proxied})
    assert r.status_code == 401 and r.json()["error"]["code"] == "unauthorized"  # past the origin check
    r = client(proxied).post("/v1/session", json={"token": "pk_x"}, headers={"Origin": "http://127.0.0.1:9999"})
    assert r.status_code == 403  # another loopback page calling through the proxy names its own origin
    assert "http://127.0.0.1:18080" in allowed_origins(Settings(), 8000, "127.0.0.1:18080")
    assert "http://127.0.0.1:18080" not in allowed_origins(Settings().with_(local_mode=False), 8000,
                                                           "127.0.0.1:18080")
    assert "http://evil.example:18080" not in allowed_origins(Settings(), 8000, "evil.example:18080")
