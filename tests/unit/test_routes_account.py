"""``GET /v1/account``: the caller's plan and how long its conversations are kept, from the loaded plans, and
its settings; ``PATCH /v1/account``: custom instructions (checked, then stored) and the default model."""
from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import httpx
import pytest
from fastapi import FastAPI

from infra.config.plans import Plan, load_plans
from infra.config.settings import Settings
from infra.stores.accounts import User
from infra.stores.preferences import MAX_INSTRUCTIONS_CHARS, Prefs
from producers.gateway import routes_account
from producers.gateway.app import install_error_handlers

TOKENS = {"tok-ann": User("ann", "free", "Ann"), "tok-pat": User("pat", "private")}


@dataclass
class Gateway:
    settings: Settings = field(default_factory=lambda: Settings(purge_delay_s=15.0, default_pool="large"))
    plans: dict[str, Plan] = field(default_factory=lambda: {
        "free": dataclasses.replace(load_plans()["free"], retention_days=30.0),
        "private": dataclasses.replace(load_plans()["private"], retention_days=0.0, no_retention=True)})

    models: dict[str, str] = field(default_factory=lambda: {"large": "m-large", "small": "m-small"})
    preferences: MemoryPreferences = field(default_factory=lambda: MemoryPreferences())

    async def user_for_token(self, token: str) -> User | None:
        return TOKENS.get(token)

    def keeps_nothing(self, user: User) -> bool:
        return self.plans[user.plan].no_retention


@dataclass
class MemoryPreferences:
    """The store's three calls, in memory; counts writes, to show a refused change writes nothing."""

    rows: dict[str, Prefs] = field(default_factory=dict)
    writes: int = 0

    async def get(self, user_id: str) -> Prefs:
        return self.rows.get(user_id, Prefs())

    async def set_instructions(self, user_id: str, text: str | None) -> None:
        self.writes += 1
        self.rows[user_id] = dataclasses.replace(await self.get(user_id), instructions=text)

    async def set_default_model(self, user_id: str, model: str | None) -> None:
        self.writes += 1
        self.rows[user_id] = dataclasses.replace(await self.get(user_id), default_model=model)


@pytest.fixture
def gateway() -> Gateway:
    return Gateway()


@pytest.fixture
async def http(gateway: Gateway) -> AsyncIterator[httpx.AsyncClient]:
    app = FastAPI()
    app.state.gateway = gateway
    install_error_handlers(app)
    app.include_router(routes_account.router)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw") as client:
        yield client


async def test_the_account_says_its_plan_and_retention(http: httpx.AsyncClient) -> None:
    ann = (await http.get("/v1/account", headers={"Authorization": "Bearer tok-ann"})).json()
    assert ann == {"user_id": "ann", "plan": "free", "display_name": "Ann", "retention_days": 30.0,
                   "no_retention": False, "purge_after_delete_s": 15.0, "default_model": "large",
                   "instructions": None}
    pat = (await http.get("/v1/account", headers={"Authorization": "Bearer tok-pat"})).json()
    assert (pat["plan"], pat["retention_days"], pat["no_retention"]) == ("private", 0.0, True)


async def test_no_token_is_a_401(http: httpx.AsyncClient) -> None:
    r = await http.get("/v1/account")
    assert r.status_code == 401 and r.json()["error"]["code"]


ANN = {"Authorization": "Bearer tok-ann"}


async def test_instructions_and_default_model_are_saved_and_read_back(http: httpx.AsyncClient,
                                                                     gateway: Gateway) -> None:
    r = await http.patch("/v1/account", headers=ANN, json={"instructions": "  Answer in French.\r\nBe brief.  "})
    assert r.status_code == 200, r.text
    assert r.json()["instructions"] == "Answer in French.\nBe brief." and r.json()["default_model"] == "large"
    r = await http.patch("/v1/account", headers=ANN, json={"default_model": "small"})
    assert (r.json()["instructions"], r.json()["default_model"]) == ("Answer in French.\nBe brief.", "small")
    got = (await http.get("/v1/account", headers=ANN)).json()
    assert (got["instructions"], got["default_model"]) == ("Answer in French.\nBe brief.", "small")
    r = await http.patch("/v1/account", headers=ANN, json={"instructions": "   "})  # blank clears them
    assert r.json()["instructions"] is None and r.json()["default_model"] == "small"
    r = await http.patch("/v1/account", headers=ANN, json={"default_model": None})  # back to the service's
    assert r.json()["default_model"] == "large"
    gateway.preferences.rows["ann"] = Prefs(None, "gone")  # a pool since removed from the service
    assert (await http.get("/v1/account", headers=ANN)).json()["default_model"] == "large"


async def test_bad_settings_are_a_422_naming_the_reason_and_change_nothing(http: httpx.AsyncClient,
                                                                           gateway: Gateway) -> None:
    too_long = '{"instructions": "%s"}' % ("x" * (MAX_INSTRUCTIONS_CHARS + 1))
    cases = [(too_long, "instructions_too_long", "4,001 characters"),
             ('{"instructions": "be kind\\u0000"}', "bad_instructions", "U+0000"),
             ('{"instructions": "ok", "default_model": "huge"}', "unknown_model", "huge"),
             ('{"instructions": "\\ud800"}', "invalid", None),  # a lone surrogate: no store could hold it
             ('{"instructions": 5}', "invalid", None),
             ('{"colour": "blue"}', "invalid", None)]
    for body, code, words in cases:
        r = await http.patch("/v1/account", headers=ANN | {"content-type": "application/json"}, content=body)
        assert r.status_code == 422, (body, r.text)
        if code != "invalid":
            assert r.json()["error"]["code"] == code and words in r.json()["error"]["message"]
    assert gateway.preferences.writes == 0
    r = await http.patch("/v1/account", headers=ANN, json={"instructions": "x" * MAX_INSTRUCTIONS_CHARS})
    assert r.status_code == 200 and len(r.json()["instructions"]) == MAX_INSTRUCTIONS_CHARS


async def test_a_plan_that_keeps_nothing_stores_no_instructions(http: httpx.AsyncClient, gateway: Gateway) -> None:
    pat = {"Authorization": "Bearer tok-pat"}
    r = await http.patch("/v1/account", headers=pat, json={"instructions": "Call me Pat."})
    assert r.status_code == 422 and r.json()["error"]["code"] == "no_retention"
    assert gateway.preferences.writes == 0
    r = await http.patch("/v1/account", headers=pat, json={"default_model": "small"})  # a model is no text
    assert r.status_code == 200 and r.json()["default_model"] == "small"
