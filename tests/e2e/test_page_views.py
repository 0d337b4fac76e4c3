"""The chat page as people see it, at desktop (1280x800) and phone (390x844) sizes, against the whole
service: nothing cut off and the conversation list in a drawer on a phone; Markdown with tables,
highlighted code and copy buttons; dark mode; the demo token kept until dismissed; and axe-core's
accessibility scan of the main views. Screenshots go to tests/artifacts/screenshots/, axe results to
tests/artifacts/axe-<size>.json."""
from __future__ import annotations

import json
from typing import Any

from tests.e2e.browser import (
    REPLY,
    Page,
    axe_scan,
    open_drawer,
    overflow,
    send,
    shot,
    sign_in,
    sse,
    until,
    wait_done,
)
from tests.e2e.conftest import ARTIFACTS, Caller

MD = ("## Prices\n\n| fruit | price |\n|---|--:|\n| apple | 1.20 |\n| pear | 0.90 |\n\n"
      "```python\ndef total(items):\n    return sum(p for _, p in items)\n```\n\n"
      "Indented:\n\n        two levels\n      one level\n\nDone, see `total`.")


async def play(page: Any, generation_id: str, markdown: str) -> None:
    """Answer the next message with ``markdown`` (the gateway's part, for exact text)."""
    start = {"message_id": f"m-{generation_id}", "generation_id": generation_id, "model": "test-model",
             "pool": "large"}
    body = sse(("message_start", start, 1), ("delta", {"text": markdown}, 2),
               ("message_end", {"stop_reason": "end", "usage": {"in": 1, "out": 9}}, 3))

    async def post(route: Any) -> None:
        if route.request.method != "POST":
            await route.fallback()
            return
        await route.fulfill(status=200, content_type="text/event-stream", body=sse(("message_start", start, 1)))

    await page.route("**/v1/conversations/*/messages", post)
    await page.route(f"**/v1/generations/{generation_id}/stream*",
                     lambda route: route.fulfill(status=200, content_type="text/event-stream", body=body))


async def test_nothing_is_cut_off_and_a_phone_gets_the_list_in_a_drawer(make_page: Page, alice: Caller,
                                                                        size: str) -> None:
    page = await make_page(size)
    await sign_in(page, alice)
    await send(page, "Say hello in one short sentence.")
    await wait_done(page)
    await until(page, "!document.querySelector('#usage').hidden")
    assert await overflow(page) == []
    sidebar = page.locator(".sidebar")
    if size == "desktop":
        assert await sidebar.is_visible() and await page.locator("#menu").is_hidden()
        await shot(page, f"20-layout-{size}")
        return
    assert not await sidebar.is_visible() and await page.locator("#menu").is_visible()
    assert await page.locator("#menu").get_attribute("aria-expanded") == "false"
    await shot(page, "20-layout-phone")
    await open_drawer(page, size)
    assert await page.locator("#menu").get_attribute("aria-expanded") == "true"
    for control in ("#new-chat", "#sign-out", "#usage", "#search", "#conversation-list a"):
        box = await page.locator(control).first.bounding_box()
        assert box and box["x"] >= 0 and box["x"] + box["width"] <= 390, (control, box)
    assert "tokens left today" in await page.locator("#usage").inner_text()
    assert await overflow(page) == []
    await shot(page, "21-drawer-phone")
    await page.locator("#conversation-list a").first.click()  # picking a conversation closes the drawer
    await until(page, "!document.querySelector('#app').classList.contains('drawer-open')", 5)
    await open_drawer(page, size)
    await page.keyboard.press("Escape")  # so does Escape, handing focus back to the menu button
    await until(page, "document.activeElement?.id === 'menu'", 5)


async def test_tables_highlighted_code_and_copy_buttons(make_page: Page, alice: Caller, size: str) -> None:
    page = await make_page(size)
    await page.context.grant_permissions(["clipboard-read", "clipboard-write"])
    await play(page, f"g-md-{size}", MD)
    await sign_in(page, alice)
    await send(page, "Show me a table and some code.")
    await wait_done(page)
    md = page.locator(f"{REPLY} .md").last
    assert await md.locator("th").all_inner_texts() == ["fruit", "price"]
    assert await md.locator("td").all_inner_texts() == ["apple", "1.20", "pear", "0.90"]
    fenced, indented = md.locator(".code-block").first, md.locator(".code-block").last
    assert await fenced.locator(".hljs-keyword").first.inner_text() == "def"
    assert await fenced.locator(".code-head span").inner_text() == "python"
    assert await indented.locator("code").text_content() == "    two levels\n  one level\n"  # spaces kept
    assert await overflow(page) == []
    await shot(page, f"22-markdown-{size}")

    async def clipboard() -> str:
        return str(await page.evaluate("navigator.clipboard.readText()"))

    await fenced.get_by_role("button", name="Copy code").click()
    assert await clipboard() == "def total(items):\n    return sum(p for _, p in items)\n"
    await page.locator(f"{REPLY} .copy-reply").last.click()
    assert await clipboard() == MD  # the reply as Markdown, not its rendering
    await page.get_by_role("button", name="Copy message").last.click()
    assert await clipboard() == "Show me a table and some code."


async def test_dark_mode_follows_the_system_and_the_toggle(make_page: Page, alice: Caller, size: str) -> None:
    page = await make_page(size, color_scheme="dark")
    await play(page, f"g-dark-{size}", MD)
    await sign_in(page, alice)
    await send(page, "Something to look at.")
    await wait_done(page)
    background = "getComputedStyle(document.body).backgroundColor"
    assert await page.evaluate(background) == "rgb(23, 24, 26)"  # the system says dark
    assert await page.locator("#theme").get_attribute("aria-pressed") == "true"
    await shot(page, f"23-dark-{size}")
    await page.locator("#theme").click()
    assert await page.evaluate(background) == "rgb(255, 255, 255)"
    assert await page.locator("#theme").get_attribute("aria-pressed") == "false"
    await page.reload()
    await page.locator("#app").wait_for(state="visible")
    assert await page.evaluate(background) == "rgb(255, 255, 255)"  # the pick is remembered
    await page.locator("#theme").click()
    assert await page.evaluate(background) == "rgb(23, 24, 26)"


async def test_the_demo_token_stays_until_dismissed(make_page: Page, size: str) -> None:
    page = await make_page(size)
    await play(page, f"g-demo-{size}", "Hello!")
    await page.goto("/")
    await page.locator("#demo-button").click()
    await page.locator("#token-note").wait_for(state="visible")
    token = await page.locator("#token-value").inner_text()
    assert token.startswith("pk_")
    await send(page, "Hi")
    await wait_done(page)
    assert await page.locator("#token-note").is_visible()  # sending does not take it away
    assert await page.locator("#token-value").inner_text() == token
    assert await overflow(page) == []
    await shot(page, f"24-demo-token-{size}")
    await page.get_by_role("button", name="Dismiss the token").click()
    assert await page.locator("#token-note").is_hidden()


async def test_axe_finds_nothing_serious_or_critical(make_page: Page, alice: Caller, size: str) -> None:
    results: dict[str, list[dict[str, Any]]] = {}
    page = await make_page(size)
    await page.goto("/")
    await page.locator("#signin").wait_for(state="visible")
    results["sign-in"] = await axe_scan(page)
    await play(page, f"g-axe-{size}", MD)
    await sign_in(page, alice)
    await send(page, "A reply with a table and code.")
    await wait_done(page)
    results["chat"] = await axe_scan(page)
    await open_drawer(page, size)
    await page.locator("#search").fill("table")
    await until(page, "document.querySelector('#search-results li')")
    results["search"] = await axe_scan(page)
    dark = await make_page(size, color_scheme="dark")
    await play(dark, f"g-axe-dark-{size}", MD)
    await sign_in(dark, alice)
    await send(dark, "The same in the dark.")
    await wait_done(dark)
    results["chat-dark"] = await axe_scan(dark)
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    (ARTIFACTS / f"axe-{size}.json").write_text(json.dumps(results, indent=2))
    bad = {view: [v for v in found if v["impact"] in ("serious", "critical")] for view, found in results.items()}
    assert bad == {view: [] for view in results}, bad
