"""DNS rebinding against a real gateway (uvicorn, Redis, Cassandra): a page whose name was re-pointed at
loopback gets no account and no cookie; the page on the gateway's own address still signs in."""
from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from infra.config.settings import Settings
from tests.integration.gateway_server import serve


@pytest.fixture
def gateway(settings: Settings, tmp_path: Path) -> Iterator[str]:
    with serve(settings.with_(state_dir=tmp_path, local_mode=True)) as url:
        yield url


def test_a_rebound_host_gets_400_and_no_session_while_the_own_origin_gets_201(gateway: str) -> None:
    evil = "evil.example:8000"
    r = httpx.post(f"{gateway}/v1/session/demo", json={}, timeout=30,
                   headers={"Host": evil, "Origin": f"http://{evil}"})
    assert r.status_code == 400 and r.json()["error"]["code"] == "untrusted_host"
    assert "set-cookie" not in r.headers
    r = httpx.post(f"{gateway}/v1/session/demo", json={}, timeout=30, headers={"Origin": f"http://{evil}"})
    assert r.status_code == 403 and r.json()["error"]["code"] == "cross_origin"  # a trusted Host, foreign Origin
    r = httpx.get(f"{gateway}/healthz", timeout=30, headers={"Host": evil})
    assert r.status_code == 200  # probes call it by address
    r = httpx.post(f"{gateway}/v1/session/demo", json={}, timeout=30, headers={"Origin": gateway})
    assert r.status_code == 201 and r.json()["user"]["plan"] == "free" and "parley_session" in r.headers["set-cookie"]
