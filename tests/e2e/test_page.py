"""The chat page in a real browser against the whole service: sign in, stream, stop, drop and resume,
reopen mid-reply, regenerate and flip versions, switch model, the sidebar, safe Markdown, errors.

Screenshots of each step go to tests/artifacts/screenshots/.
"""
from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import httpx
import pytest

from tests.e2e.browser import (
    REPLY,
    conversation_id,
    is_local,
    rendered,
    reply_text,
    saved_replies,
    send,
    shot,
    sign_in,
    sse,
    text_longer_than,
    until,
    wait_done,
)
from tests.e2e.conftest import Caller, browser  # noqa: F401 - re-exported: other page tests import it from here
from tests.e2e.proxy import DroppingProxy
from tests.e2e.service import Service

OpenPage = Callable[..., Awaitable[Any]]
LONG = "Write a long story about a lighthouse keeper and the sea."


@pytest.fixture
async def open_page(browser: Any, service: Service) -> AsyncIterator[OpenPage]:  # noqa: F811
    """Pages in fresh contexts; afterwards, no page error and no request left this machine."""
    contexts, problems = [], []

    async def make(base_url: str | None = None, height: int = 820) -> Any:
        context = await browser.new_context(base_url=base_url or service.url("gateway-a"),
                                            viewport={"width": 1240, "height": height})
        context.on("request", lambda r: None if is_local(r.url) else problems.append(f"request to {r.url}"))
        contexts.append(context)
        page = await context.new_page()
        page.on("pageerror", lambda e: problems.append(f"page error: {e}"))
        return page

    yield make
    for context in contexts:
        await context.close()
    assert not problems, problems


async def test_sign_in_send_watch_it_stream_and_stop(open_page: OpenPage, http: httpx.AsyncClient,
                                                     alice: Caller) -> None:
    page = await open_page()
    await page.goto("/")
    await page.locator("#token").fill("pk_not-a-token")
    await page.locator("#signin-form button[type=submit]").click()
    await until(page, "!document.querySelector('#signin-error').hidden")
    refused = await page.locator("#signin-error").inner_text()
    assert "not valid" in refused and "`" not in refused  # the command it names is shown as code
    assert "parley user create" in await page.locator("#signin-error code").all_inner_texts()
    await shot(page, "01-sign-in-refused")
    await sign_in(page, alice)
    await shot(page, "02-signed-in")

    await send(page, LONG)
    first = await text_longer_than(page, 0)
    await text_longer_than(page, len(first))  # it grows while the model writes: streaming, not one block
    await shot(page, "03-streaming")
    await page.locator("#stop").click()
    await wait_done(page)
    await shot(page, "04-stopped")
    assert await page.locator(f"{REPLY} .status").last.inner_text() == "Stopped"

    cid = await conversation_id(page)
    [saved] = await saved_replies(http, alice, cid)
    assert saved["status"] == "stopped" and saved["content"]
    assert await reply_text(page) == await rendered(page, saved["content"])
    assert await page.locator(f"#conversation-list a[href='#/c/{cid}']").count() == 1
    assert await page.locator(f"{REPLY} .model").last.inner_text() == f"{saved['pool']} · {saved['model']}"
    # who speaks, for a screen reader: read before each message, hidden from sight
    assert await page.locator("#messages .sr-only").all_text_contents() == ["You said:", "Parley replied:"]
    assert (await page.locator("#messages .sr-only").first.bounding_box() or {"width": 0})["width"] <= 1


async def test_a_dropped_connection_resumes_with_last_event_id(open_page: OpenPage, service: Service,
                                                               http: httpx.AsyncClient, alice: Caller) -> None:
    gateway_port = service.procs["gateway-a"].port
    assert gateway_port is not None
    async with DroppingProxy(gateway_port) as proxy:
        page = await open_page(proxy.url)
        await sign_in(page, alice)
        await send(page, "Explain how bread dough rises, in detail, with examples.")
        before = await text_longer_than(page, 20)
        proxy.drop()
        await until(page, f"document.querySelector('{REPLY}.reconnecting')", 10)
        await shot(page, "05-reconnecting")
        await wait_done(page)
        await shot(page, "06-resumed")

    cid = await conversation_id(page)
    [saved] = await saved_replies(http, alice, cid)
    shown = await reply_text(page)
    assert shown == await rendered(page, saved["content"])  # nothing repeated, nothing lost
    assert len(shown) > len(before) and saved["status"] in ("complete", "length")  # it went on after the drop
    resumed = [ids for path, ids in proxy.requests if "/stream" in path][1:]
    assert resumed and all(ids and int(ids) > 0 for ids in resumed), proxy.requests  # the browser's own resume


async def test_reopening_a_conversation_mid_reply_attaches_to_it(open_page: OpenPage, http: httpx.AsyncClient,
                                                                 alice: Caller) -> None:
    page = await open_page()
    await sign_in(page, alice)
    await send(page, LONG)
    await text_longer_than(page, 10)
    cid = await conversation_id(page)
    await page.reload()  # the address keeps the conversation: it opens again and follows the reply
    await until(page, f"document.querySelector('{REPLY}.generating .md')?.textContent.length > 0", 30)
    await shot(page, "07-reopened-mid-reply")
    await wait_done(page)
    [saved] = await saved_replies(http, alice, cid)
    assert await reply_text(page) == await rendered(page, saved["content"])


async def test_switch_model_regenerate_and_flip_versions(open_page: OpenPage, http: httpx.AsyncClient,
                                                         alice: Caller) -> None:
    page = await open_page()
    await sign_in(page, alice)
    await page.locator("#model").select_option("small")
    await send(page, "Say hello in French.")
    await wait_done(page)
    model = page.locator(f"{REPLY} .model").last
    assert (await model.inner_text()).startswith("small · ")  # the reply names the pool that answered
    first = await reply_text(page)
    await shot(page, "08-small-model-reply")

    await page.locator("#model").select_option("large")
    await page.locator(f"{REPLY} .regenerate").click()
    await until(page, "document.querySelector('.version-label')?.textContent === '2/2'")
    await wait_done(page)
    assert (await model.inner_text()).startswith("large · ")
    second = await reply_text(page)
    await shot(page, "09-regenerated-2-of-2")

    await page.locator(".versions .prev").click()
    assert await page.locator(".version-label").inner_text() == "1/2"
    assert await reply_text(page) == first and (await model.inner_text()).startswith("small · ")
    await shot(page, "10-version-1-of-2")
    await page.locator(".versions .next").click()
    assert await page.locator(".version-label").inner_text() == "2/2" and await reply_text(page) == second

    cid = await conversation_id(page)
    replies = await saved_replies(http, alice, cid)
    assert len({m["parent_id"] for m in replies}) == 1 and [m["pool"] for m in replies] == ["small", "large"]
    link = page.locator(f"#conversation-list a[href='#/c/{cid}']")
    await until(page, "(id) => !document.querySelector(`#conversation-list a[href='#/c/${id}']`)"
                      ".classList.contains('untitled')", 180, cid)  # the title shows up without a reload
    assert (await link.inner_text()).strip() and await page.locator("#chat-title").inner_text() != "New conversation"
    await shot(page, "11-title-arrived")


async def test_sidebar_is_newest_first_and_loads_more_as_it_scrolls(open_page: OpenPage, http: httpx.AsyncClient,
                                                                     alice: Caller) -> None:
    for n in range(1, 46):
        r = await http.post("/v1/conversations", headers=alice.headers, json={"title": f"Topic {n:02d}"})
        assert r.status_code == 201
    page = await open_page(height=700)
    await sign_in(page, alice)
    links = page.locator("#conversation-list a")
    await until(page, "document.querySelectorAll('#conversation-list a').length >= 20")
    assert await links.count() < 45  # one page, not everything
    for _ in range(10):
        await page.locator("#conversations").evaluate("nav => nav.scrollTo(0, nav.scrollHeight)")
        await page.wait_for_timeout(300)
        if await links.count() == 45:
            break
    await shot(page, "12-sidebar-scrolled")
    titles = [t.strip() for t in await links.all_inner_texts()]
    assert titles == [f"Topic {n:02d}" for n in range(45, 0, -1)]


async def test_model_output_is_markdown_that_cannot_run_script(open_page: OpenPage, alice: Caller) -> None:
    hostile = ("# Plan\n<img src=x onerror=\"window.pwned=1\">\n<script>window.pwned=2</script>\n\n"
               "Some **bold**, *italic* and `<b>code</b>`; [bad](javascript:window.pwned=3), "
               "[good](https://example.com/a).\n\n- one <svg onload=window.pwned=4>\n- two\n\n"
               "```js\ndocument.body.innerHTML = '<img src=x onerror=alert(1)>';\n```\n\n"
               "| cell | <img src=x onerror=window.pwned=5> |\n|---|---|\n"
               "| <a href=\"javascript:window.pwned=6\">raw</a> "
               "| <iframe src=\"/\" onload=\"window.pwned=7\"></iframe> |\n\n"
               "![pic](javascript:window.pwned=8) <details open ontoggle=window.pwned=9>x</details> "
               "<style>*{display:none}</style> [data](data:text/html;base64,PHNjcmlwdD4=)\n\n"
               "- [ ] to do\n- [x] done <input type=text onfocus=window.pwned=10>\n")
    page = await open_page()
    await _play_gateway(page, "g-md", [sse(("message_start", _start("g-md"), 1), ("delta", {"text": hostile}, 2),
                                           ("message_end", {"stop_reason": "end", "usage": {"in": 1, "out": 9}}, 3))])
    await sign_in(page, alice)
    await send(page, "Show me some Markdown.")
    await wait_done(page)
    await shot(page, "13-markdown-rendered-safely")
    md = page.locator(f"{REPLY} .md").last
    assert await page.evaluate("window.pwned") is None
    assert await md.locator("img, script, svg, iframe, style, details, [onerror], [onload], [ontoggle]").count() == 0
    assert await md.locator("a[href^='javascript'], a[href^='data']").count() == 0
    assert await md.locator("a").get_attribute("href") == "https://example.com/a"
    assert await md.locator("a").get_attribute("rel") == "noopener noreferrer nofollow"
    assert await md.locator("h1").inner_text() == "Plan" and await md.locator("strong").inner_text() == "bold"
    assert await md.locator("li:not(.task)").count() == 2
    assert "<svg onload" in await md.locator("li").first.inner_text()
    boxes = md.locator("li.task > input[type=checkbox]")  # a GFM task list: boxes shown, never tickable
    assert await boxes.count() == 2 and await md.locator("li.task input:checked").count() == 1
    assert await md.locator("li.task input:not([disabled])").count() == 0
    assert await md.locator("input:not([type=checkbox])").count() == 0 and "<input type=text" in await md.inner_text()
    assert "innerHTML = '<img" in await md.locator("pre code").inner_text()
    assert "<script>window.pwned=2</script>" in await md.inner_text()  # shown as the characters it is
    assert await md.locator("table td").count() == 2 and "<iframe" in await md.locator("table").inner_text()
    assert await md.locator("pre code .hljs-string").count() >= 1  # highlighted, still only text in spans


async def test_queue_position_then_cut_streams_resume_without_repeats(open_page: OpenPage, alice: Caller) -> None:
    fast = "retry: 200\n\n"  # reconnect after 0.2 s (the gateway asks for 1 s)
    bodies = [fast + sse(("message_start", _start("g-q"), 5), ("queued", {"position": 3, "estimated_wait_s": 12.0}, 5)),
              sse(("delta", {"text": "Hello "}, 6)),  # each of these ends mid-reply: the connection dropped
              sse(("delta", {"text": "Hello "}, 6), ("delta", {"text": "world."}, 7),  # 6 again: must not repeat
                  ("message_end", {"stop_reason": "end", "usage": {"in": 1, "out": 2}}, 8))]
    page = await open_page()
    resumes = await _play_gateway(page, "g-q", bodies)
    await sign_in(page, alice)
    await send(page, "Hi")
    await until(page, f"document.querySelector('{REPLY} .notice')?.textContent.includes('number 3 in line')", 10)
    assert "about 12 s" in await page.locator(f"{REPLY} .notice").inner_text()
    await shot(page, "14-queued-and-reconnecting")
    await wait_done(page)
    assert await reply_text(page) == "Hello world." and len(resumes) == 3


async def test_a_queued_wait_counts_down_and_takes_a_revised_estimate(open_page: OpenPage, alice: Caller) -> None:
    fast = "retry: 200\n\n"
    notice = f"document.querySelector('{REPLY} .notice')?.textContent || ''"
    bodies = [fast + sse(("message_start", _start("g-w"), 5), ("queued", {"position": 3, "estimated_wait_s": 6.0}, 5)),
              fast + ": keep-alive\n\n",  # nothing new for a while: the page counts down on its own
              fast + sse(("queued", {"position": 1, "estimated_wait_s": 30.0}, 6)),  # the service's revision
              sse(("delta", {"text": "Done."}, 7),
                  ("message_end", {"stop_reason": "end", "usage": {"in": 1, "out": 1}}, 8))]
    page = await open_page()
    await _play_gateway(page, "g-w", bodies)
    await sign_in(page, alice)
    await send(page, "Hi")
    await until(page, f"({notice}).includes('number 3 in line, about 6 s')", 10)
    await until(page, f"/about [45] s/.test({notice})", 5)  # counted down between estimates
    await shot(page, "14b-queued-counting-down")
    await until(page, f"({notice}).includes('next in line, about 30 s')", 10)
    await wait_done(page)
    assert await reply_text(page) == "Done." and await page.locator(f"{REPLY} .notice").is_hidden()


async def test_refusals_and_usage_read_as_the_server_wrote_them(open_page: OpenPage, alice: Caller) -> None:
    page = await open_page()
    limit = "Daily limit reached — resets at 00:00 UTC"
    midnight = (int(time.time()) // 86400 + 1) * 86400
    usage = {"used": 30000, "remaining": 0, "daily_limit": 30000, "resets_at": midnight}
    await page.route("**/v1/usage", lambda route: route.fulfill(json=usage))
    await page.route("**/v1/conversations/*/messages", lambda route: route.fulfill(
        status=429, headers={"Retry-After": "3600"},
        json={"error": {"code": "daily_limit", "message": limit, "retry_after_s": 3600}})
        if route.request.method == "POST" else route.fallback())
    await sign_in(page, alice)
    assert await page.locator("#usage").inner_text() == "0 of 30,000 tokens left today · resets 00:00 UTC"
    await send(page, "One more, please.")
    await until(page, "!document.querySelector('#banner').hidden")
    await shot(page, "15-daily-limit")
    assert await page.locator("#banner-text").inner_text() == limit
    assert await page.locator("#input").input_value() == "One more, please."  # not sent: the words come back
    assert await page.locator(REPLY).count() == 0

    await page.route("**/v1/usage", lambda route: route.fulfill(status=404, json={"detail": "Not Found"}))
    await page.reload()
    await page.locator("#app").wait_for(state="visible")
    assert await page.locator("#usage").is_hidden()  # a service without /v1/usage: nothing shown, no error


async def test_demo_user_in_local_mode_and_the_session_cookie(open_page: OpenPage) -> None:
    page = await open_page()
    await page.goto("/")
    await page.locator("#demo-button").click()
    await page.locator("#app").wait_for(state="visible")
    await page.locator("#token-note").wait_for(state="visible")  # its token, shown until dismissed
    token = await page.locator("#token-value").inner_text()
    assert token.startswith("pk_")
    assert await page.locator("#who").inner_text() == "demo · free plan"
    await shot(page, "16-demo-user")
    [cookie] = [c for c in await page.context.cookies() if c["name"] == "parley_session"]
    assert cookie["httpOnly"] and cookie["sameSite"] == "Strict" and cookie["path"] == "/"
    assert not cookie["secure"]  # plain http here; the gateway marks it Secure when the request came over TLS
    assert cookie["value"] != token and token not in cookie["value"]  # a session id, never the API token
    assert await page.evaluate("document.cookie") == ""  # out of reach of any script
    await page.locator("#sign-out").click()
    await page.locator("#signin").wait_for(state="visible")
    assert not [c for c in await page.context.cookies() if c["name"] == "parley_session"]


# -- playing the gateway's part, for what the real one can't be made to do on cue ---------------------------
def _start(generation_id: str) -> dict[str, Any]:
    return {"message_id": f"m-{generation_id}", "generation_id": generation_id, "model": "test-model", "pool": "large"}


async def _play_gateway(page: Any, generation_id: str, bodies: list[str]) -> list[dict[str, str]]:
    """Answer the POST with message_start, then each stream request with the next body; their headers."""
    seen: list[dict[str, str]] = []

    async def post(route: Any) -> None:
        if route.request.method != "POST":
            await route.fallback()
            return
        await route.fulfill(status=200, content_type="text/event-stream",
                            body=sse(("message_start", _start(generation_id), 1)))

    async def stream(route: Any) -> None:
        seen.append(await route.request.all_headers())
        if len(seen) > 1:
            await asyncio.sleep(1)  # a second of being cut off, long enough to see it said on the page
        body = bodies[min(len(seen), len(bodies)) - 1]
        await route.fulfill(status=200, content_type="text/event-stream", body=body)

    await page.route("**/v1/conversations/*/messages", post)
    await page.route(f"**/v1/generations/{generation_id}/stream*", stream)
    return seen
