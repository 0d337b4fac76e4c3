"""``GET /v1/account``: the caller's plan and how long its conversations are kept, from the loaded plans."""
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
from producers.gateway import routes_account
from producers.gateway.app import install_error_handlers

TOKENS = {"tok-ann": User("ann", "free", "Ann"), "tok-pat": User("pat", "private")}


@dataclass
class Gateway:
    settings: Settings = field(default_factory=lambda: Settings(purge_delay_s=15.0, default_pool="large"))
    plans: dict[str, Plan] = field(default_factory=lambda: {
        "free": dataclasses.replace(load_plans()["free"], retention_days=30.0),
        "private": dataclasses.replace(load_plans()["private"], retention_days=0.0, no_retention=True)})

    async def user_for_token(self, token: str) -> User | None:
        return TOKENS.get(token)


@pytest.fixture
async def http() -> AsyncIterator[httpx.AsyncClient]:
    app = FastAPI()
    app.state.gateway = Gateway()
    install_error_handlers(app)
    app.include_router(routes_account.router)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw") as client:
        yield client


async def test_the_account_says_its_plan_and_retention(http: httpx.AsyncClient) -> None:
    ann = (await http.get("/v1/account", headers={"Authorization": "Bearer tok-ann"})).json()
    assert ann == {"user_id": "ann", "plan": "free", "display_name": "Ann", "retention_days": 30.0,
                   "no_retention": False, "purge_after_delete_s": 15.0, "default_model": "large"}
    pat = (await http.get("/v1/account", headers={"Authorization": "Bearer tok-pat"})).json()
    assert (pat["plan"], pat["retention_days"], pat["no_retention"]) == ("private", 0.0, True)


async def test_no_token_is_a_401(http: httpx.AsyncClient) -> None:
    r = await http.get("/v1/account")
    assert r.status_code == 401 and r.json()["error"]["code"]
