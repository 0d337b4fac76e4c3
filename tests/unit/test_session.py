"""The page's routes without any backend: the page and its files, the session cookie, demo users' guard."""
from __future__ import annotations

import re

import pytest
from fastapi.testclient import TestClient

from infra.config.settings import Settings
from producers.gateway.app import create_app
from producers.gateway.routes_web import STATIC

OWN_FILES = ("app.js", "api.js", "branch.js", "chat.js", "chrome.js", "markdown.js", "search.js", "sidebar.js",
             "view.js", "app.css")
VENDORED = ("vendor/marked.esm.js", "vendor/purify.es.js", "vendor/highlight.min.js")


def client(address: str = "127.0.0.1", **settings: object) -> TestClient:
    # No `with`: the lifespan (Kafka, Redis, Cassandra) never starts; these routes don't need it.
    # The TestClient calls itself "testserver": the page's public URL here, so its Host and Origin are allowed.
    settings = {"public_url": "http://testserver", **settings}
    return TestClient(create_app(Settings().with_(**settings), {"large": "m"}), client=(address, 50000))


def test_the_page_is_served_with_a_policy_that_forbids_inline_and_foreign_script() -> None:
    r = client().get("/")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    assert '<script type="module" src="/static/app.js">' in r.text
    csp = r.headers["content-security-policy"]
    assert "script-src 'self'" in csp and "unsafe-inline" not in csp and "connect-src 'self'" in csp


def test_static_files_are_served_and_nothing_outside_the_folder() -> None:
    c = client()
    for name in OWN_FILES + VENDORED:
        r = c.get(f"/static/{name}")
        assert r.status_code == 200, name
    assert "javascript" in c.get("/static/app.js").headers["content-type"]
    assert c.get("/static/../app.py").status_code == 404
    assert c.get("/static/%2e%2e/app.py").status_code == 404


def test_no_file_loads_anything_from_another_origin() -> None:
    c = client()
    for name in OWN_FILES:
        body = c.get(f"/static/{name}").text
        assert "innerHTML" not in body and "insertAdjacentHTML" not in body and "document.write" not in body, name
        assert "//cdn" not in body and "import(\"http" not in body and "@import" not in body, name


def test_vendored_libraries_come_with_their_licences_and_are_loaded_from_this_origin() -> None:
    vendor = STATIC / "vendor"
    for name in ("marked", "dompurify", "highlight"):
        assert (vendor / f"{name}.LICENSE").stat().st_size > 500, name
    imports = re.findall(r'^import .* from "([^"]+)";', (STATIC / "markdown.js").read_text(), re.M)
    assert imports == ["./vendor/marked.esm.js", "./vendor/purify.es.js", "./vendor/highlight.min.js"]
    for name in VENDORED:  # no library reaches for another origin or for eval
        body = (STATIC / name).read_text()
        assert "eval(" not in body and "new Function" not in body and "https://cdn" not in body, name


def test_signed_out_session_says_so_and_whether_demo_users_are_on() -> None:
    assert client().get("/v1/session").json() == {"user": None, "local_mode": True}
    assert client(local_mode=False).get("/v1/session").json() == {"user": None, "local_mode": False}


@pytest.mark.parametrize(("address", "local"), [("127.0.0.1", False), ("203.0.113.9", True), ("203.0.113.9", False)])
def test_demo_users_are_refused_unless_local_mode_and_a_local_caller(address: str, local: bool) -> None:
    r = client(address, local_mode=local).post("/v1/session/demo", json={"plan": "free"})
    assert r.status_code == 403
    assert r.json()["error"]["code"] == "not_local" and "parley user create" in r.json()["error"]["message"]


def test_demo_users_are_free_plan_only() -> None:
    r = client().post("/v1/session/demo", json={"plan": "paid"})
    assert r.status_code == 422 and r.json()["error"]["code"] == "invalid_request" and "free" in r.text


def test_a_cross_origin_sign_in_or_sign_out_is_refused_before_anything_happens() -> None:
    evil = {"Origin": "https://evil.example"}
    for r in (client().delete("/v1/session", headers=evil),
              client().post("/v1/session", json={"token": "pk_x"}, headers=evil),
              client().post("/v1/session/demo", json={}, headers={"Referer": "https://evil.example/page"})):
        assert r.status_code == 403 and r.json()["error"]["code"] == "cross_origin"


def test_a_cookie_call_that_changes_something_must_name_this_origin() -> None:
    c = client()
    c.cookies.set("parley_session", "s-1")
    for headers in ({}, {"Origin": "http://127.0.0.1:9"}, {"Origin": "null"}):
        r = c.post("/v1/conversations", json={}, headers=headers)
        assert r.status_code == 403 and r.json()["error"]["code"] == "cross_origin", headers


def test_session_expiry_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PARLEY_SESSION_TTL_S", "3600")
    assert Settings.from_env().session_ttl_s == 3600
    assert Settings().session_ttl_s == 7 * 24 * 3600


def test_local_mode_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PARLEY_LOCAL_MODE", raising=False)
    assert Settings.from_env().local_mode is True  # the services are on loopback
    monkeypatch.setenv("PARLEY_LOCAL_MODE", "false")
    assert Settings.from_env().local_mode is False
    monkeypatch.setenv("PARLEY_LOCAL_MODE", "maybe")
    with pytest.raises(ValueError, match="PARLEY_LOCAL_MODE"):
        Settings.from_env()
