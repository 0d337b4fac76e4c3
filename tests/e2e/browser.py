"""Driving the chat page in Debian's headless Chromium (Playwright for Python, no downloaded browser).

Playwright's wait_for_function evaluates strings, which the page's Content-Security-Policy forbids
(no 'unsafe-eval'), so waiting is done by polling ``page.evaluate`` instead: the page is tested
under its real policy.
"""
from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable
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


SIZES = {"desktop": (1280, 800), "phone": (390, 844)}
AXE = Path(__file__).with_name("vendor") / "axe.min.js"  # axe-core 4.14.1 from npm, MPL-2.0


async def new_page(browser: Any, base_url: str, size: str, problems: list[str], **context: Any) -> Any:
    """A page at a named size in a fresh context; page errors and requests off this machine go to ``problems``."""
    width, height = SIZES[size]
    ctx = await browser.new_context(base_url=base_url, viewport={"width": width, "height": height}, **context)
    ctx.on("request", lambda r: None if is_local(r.url) else problems.append(f"request to {r.url}"))
    page = await ctx.new_page()
    page.on("pageerror", lambda e: problems.append(f"page error: {e}"))
    return page


async def axe_scan(page: Any) -> list[dict[str, Any]]:
    """axe-core's violations on the page as it is now (evaluated over DevTools: the page's CSP still holds)."""
    await page.evaluate(AXE.read_text())
    return list(await page.evaluate(
        "async () => (await axe.run(document, { resultTypes: ['violations'] })).violations.map((v) => ("
        "{ id: v.id, impact: v.impact, help: v.help, nodes: v.nodes.map((n) => n.target.join(' ')) }))"))


OVERFLOW_JS = """() => {
  const w = document.documentElement.clientWidth, out = [];
  const page = document.documentElement.scrollWidth;
  if (page > w) out.push(`page scrolls sideways: ${page} > ${w}`);
  for (const e of document.querySelectorAll('#app button, #app input, #app select, #app textarea, #app a, #app h1')) {
    const r = e.getBoundingClientRect();
    if (!r.width || getComputedStyle(e).visibility === 'hidden') continue;
    if (e.closest('[inert], [hidden], .table-wrap, pre')) continue;  // hidden, or scrolls in its own box
    if (r.left < -1 || r.right > w + 1) out.push(`${e.id || e.className || e.tagName} ${r.left}..${r.right}`);
  }
  return out;
}"""


async def overflow(page: Any) -> list[str]:
    """Visible elements of the page that stick out of the viewport sideways (cut off on a phone)."""
    return list(await page.evaluate(OVERFLOW_JS))


async def open_drawer(page: Any, size: str) -> None:
    """On a phone the list, New chat, Sign out and the token count are in the drawer: open it."""
    if size == "phone" and not await page.evaluate("document.querySelector('#app').classList.contains('drawer-open')"):
        await page.locator("#menu").click()
        await until(page, "getComputedStyle(document.querySelector('.sidebar')).transform === 'none'", 5)


Page = Callable[..., Awaitable[Any]]  # make_page(size, **context) -> a Playwright page
