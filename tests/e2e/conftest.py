"""The whole service, started once for the end-to-end tests, and users to call it with."""
from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from infra.config.settings import Settings
from tests.e2e.service import Service, launch
from tests.tools import missing

ARTIFACTS = Path(__file__).resolve().parents[1] / "artifacts"


@pytest.fixture(scope="package")  # stopped when the e2e tests end: its engines are not held through the rest
def service(stack_settings: Settings) -> Iterator[Service]:
    log_dir = ARTIFACTS / "e2e-logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    data = Path(__file__).with_name("data")
    svc = launch(stack_settings, log_dir, plans_file=data / "plans.toml", PARLEY_SAFETY_FILE=str(data / "safety.toml"))
    yield svc
    svc.stop()


@dataclass
class Caller:
    user_id: str
    token: str
    plan: str

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"}


async def _make_user(settings: Settings, plan: str) -> Caller:
    from infra.stores.accounts import Accounts
    from infra.stores.session import AsyncSession, connect

    cluster, session = connect(settings)
    try:
        user, token = await Accounts(AsyncSession(session)).create_user(plan)
    finally:
        cluster.shutdown()
    return Caller(user.user_id, token, plan)


@pytest.fixture(scope="package")
async def browser() -> AsyncIterator[Any]:
    """Debian's headless Chromium under Playwright (no downloaded browser)."""
    from tests.e2e.browser import ARGS, CHROMIUM

    if not CHROMIUM.exists():
        missing("Debian's chromium", "apt-get install chromium")
    from playwright.async_api import async_playwright

    async with async_playwright() as pw:
        b = await pw.chromium.launch(executable_path=str(CHROMIUM), args=ARGS, headless=True)
        yield b
        await b.close()


@pytest.fixture
async def alice(service: Service) -> Caller:
    return await _make_user(service.settings, "paid")


@pytest.fixture
async def bob(service: Service) -> Caller:
    return await _make_user(service.settings, "free")


@pytest.fixture
async def http(service: Service) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=service.url("gateway-a"), timeout=httpx.Timeout(120, connect=10)) as c:
        yield c


async def eventually(check, timeout: float = 30, every: float = 0.3):  # type: ignore[no-untyped-def]
    """Poll ``check`` (async, returns a value or None) until it returns something truthy."""
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        value = await check()
        if value or asyncio.get_running_loop().time() > deadline:
            return value
        await asyncio.sleep(every)


@pytest.fixture(params=["desktop", "phone"])  # tests.e2e.browser.SIZES
def size(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
async def make_page(browser: Any, service: Service) -> AsyncIterator[Any]:
    """``make(size, **context)``: a signed-out page of gateway-a; every page's console errors fail the test."""
    from tests.e2e.browser import new_page  # browser.py imports this module

    contexts: list[Any] = []
    problems: list[str] = []

    async def make(size: str, **context: Any) -> Any:
        page = await new_page(browser, service.url("gateway-a"), size, problems, **context)
        contexts.append(page.context)
        return page

    yield make
    for context in contexts:
        await context.close()
    assert not problems, problems
