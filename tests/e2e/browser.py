"""Driving the chat page in Debian's headless Chromium (Playwright for Python, no downloaded browser).

Playwright's wait_for_function evaluates strings, which the page's Content-Security-Policy forbids
(no 'unsafe-eval'), so waiting is done by polling ``page.evaluate`` instead: the page is tested
under its real policy.
"""
from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import httpx

from tests.e2e.conftest import ARTIFACTS, Caller

CHROMIUM = Path("/usr/bin/chromium")
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync"]
SHOTS = ARTIFACTS / "screenshots"
REPLY = "article.msg.assistant"
DONE_S = 240  # a whole reply on a busy 2-core machine


def is_local(url: str) -> bool:
    parsed = urlparse(url)
    return parsed.scheme in ("data", "blob", "about") or parsed.hostname in ("127.0.0.1", "localhost")


async def until(page: Any, js: str, timeout: float = 60, arg: Any = None) -> Any:
    """Poll a JS expression (or function of ``arg``) until it is truthy; its value."""
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        value = await page.evaluate(js, arg)
        if value:
            return value
        if asyncio.get_running_loop().time() > deadline:
            await shot(page, f"failed-wait-{int(time.time())}")  # what the page showed instead
            raise AssertionError(f"not true after {timeout:.0f}s: {js}")
        await asyncio.sleep(0.05)


async def shot(page: Any, name: str) -> None:
    SHOTS.mkdir(parents=True, exist_ok=True)
    await page.screenshot(path=str(SHOTS / f"{name}.png"))


async def sign_in(page: Any, who: Caller) -> None:
    await page.goto("/")
    await page.locator("#token").fill(who.token)
    await page.locator("#signin-form button[type=submit]").click()
    await page.locator("#app").wait_for(state="visible")
    await until(page, "document.querySelectorAll('#model option').length > 0")


async def send(page: Any, text: str) -> None:
    """Type and press Enter; the page has drawn the pending reply by the time the key press returns."""
    await page.locator("#input").fill(text)
    await page.locator("#input").press("Enter")


async def reply_text(page: Any) -> str:
    """What the last shown reply reads, as text (Markdown already rendered)."""
    return str(await page.evaluate(f"[...document.querySelectorAll('{REPLY} .md')].at(-1)?.textContent ?? ''"))


async def text_longer_than(page: Any, n: int, timeout: float = DONE_S) -> str:
    await until(page, f"([...document.querySelectorAll('{REPLY} .md')].at(-1)?.textContent.length ?? 0) > {n}"
                      f" && document.querySelector('{REPLY}.generating')", timeout)
    return await reply_text(page)


async def wait_done(page: Any, timeout: float = DONE_S) -> None:
    await until(page, f"!document.querySelector('{REPLY}.generating') && !document.querySelector('#send').hidden",
                timeout)


async def rendered(page: Any, markdown: str) -> str:
    """The text the page's own renderer makes of ``markdown`` (to compare with what it shows)."""
    return str(await page.evaluate(
        "async (md) => { const { renderMarkdown } = await import('/static/markdown.js');"
        " const box = document.createElement('div'); box.append(renderMarkdown(md)); return box.textContent; }",
        markdown))


async def conversation_id(page: Any) -> str:
    return str(await until(page, "location.hash.startsWith('#/c/') && decodeURIComponent(location.hash.slice(4))"))


async def saved_replies(http: httpx.AsyncClient, who: Caller, cid: str, timeout: float = 60) -> list[dict[str, Any]]:
    """The conversation's replies once none is still generating."""
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        r = await http.get(f"/v1/conversations/{cid}/messages", headers=who.headers)
        assert r.status_code == 200, r.text
        replies = [m for m in r.json()["items"] if m["role"] == "assistant"]
        if replies and all(m["status"] != "generating" for m in replies):
            return replies
        assert asyncio.get_running_loop().time() < deadline, replies
        await asyncio.sleep(0.3)


def sse(*frames: tuple[str, dict[str, Any], int | None]) -> str:
    """An SSE body, for tests that play the gateway's part."""
    out = []
    for event, data, id_ in frames:
        out.append((f"id: {id_}\n" if id_ is not None else "") + f"event: {event}\ndata: {json.dumps(data)}\n\n")
    return "".join(out)
