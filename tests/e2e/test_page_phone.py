"""The chat page on a phone (390x844, touch) against the whole service: every action is a tap on a target of
at least 44 px, with nothing shown only on hover. A conversation's ⋯ menu in the drawer renames, shares,
exports and deletes; a message's Copy and Edit, a reply's Copy, version arrows and Regenerate (on an earlier
reply too) all work by touch; wide tables and code scroll sideways in their own box instead of breaking words.
Screenshots go to tests/artifacts/screenshots/."""
from __future__ import annotations

import json
from typing import Any

import httpx

from tests.e2e.browser import (
    REPLY,
    Page,
    conversation_id,
    open_drawer,
    overflow,
    reply_text,
    saved_replies,
    send,
    shot,
    sign_in,
    until,
    wait_done,
)
from tests.e2e.conftest import Caller
from tests.e2e.test_page_privacy import answer_dialogs
from tests.e2e.test_page_views import play

PHONE = {"has_touch": True, "is_mobile": True}

# Visible controls smaller than 44 px either way (links inside a reply's text are words, not targets).
SMALL_TARGETS = """() => {
  const out = [];
  for (const e of document.querySelectorAll('#app button, #app a, #app select, #app input, #app textarea,'
                                            + ' dialog[open] button, dialog[open] input, dialog[open] select')) {
    const r = e.getBoundingClientRect();
    if (!r.width || getComputedStyle(e).visibility === 'hidden' || e.closest('[hidden], [inert]')) continue;
    if (e.closest('.md p, .md li, .md td, .md th')) continue;
    if (r.width < 44 || r.height < 44) out.push(`${e.className || e.id || e.tagName} ${r.width}x${r.height}`);
  }
  return out;
}"""

WIDE = ("| Fruit | Origin | Season | Notes |\n|---|---|---|---|\n"
        "| Fruitbasketwithoutspaces | Mediterraneancoastlands | Latesummerthroughautumn | Keepscoolforaweek |\n\n"
        "```python\nprint('" + "a long line of code that does not fit on a phone " * 3 + "')\n```\n")


async def small_targets(page: Any) -> list[str]:
    return list(await page.evaluate(SMALL_TARGETS))


async def test_every_message_action_is_a_44px_tap(make_page: Page, http: httpx.AsyncClient, alice: Caller) -> None:
    page = await make_page("phone", **PHONE)
    await page.context.grant_permissions(["clipboard-read", "clipboard-write"])
    await sign_in(page, alice)
    await send(page, "Name a fruit.")
    await wait_done(page)
    cid = await conversation_id(page)
    await send(page, "Name a vegetable.")
    await wait_done(page)
    await until(page, "document.querySelectorAll('.msg.user .edit').length === 2")  # saved ids arrived
    assert await small_targets(page) == []
    assert await page.locator(f"{REPLY} .regenerate").count() == 2  # every reply, not only the last
    await shot(page, "phone-01-messages")

    await page.locator(f"{REPLY} .copy-reply").first.tap()
    # The reply's Markdown as written (a list keeps its "1."), not the text the page drew from it.
    first = next(r for r in await saved_replies(http, alice, cid) if r["turn"] == 0)["content"]
    assert (await page.evaluate("navigator.clipboard.readText()")).strip() == first.strip()
    await page.locator(".msg.user").first.get_by_role("button", name="Copy message").tap()
    assert await page.evaluate("navigator.clipboard.readText()") == "Name a fruit."

    # Regenerate the first reply: a second version at the first turn, a branch of its own (the second turn
    # stays on the first version).
    await page.locator(f"{REPLY} .regenerate").first.tap()
    await until(page, "document.querySelector('.reply-meta .version-label')?.textContent === '2/2'")
    await wait_done(page)
    assert await page.locator(".msg.user").count() == 1
    replies = await saved_replies(http, alice, cid)
    first_turn = [r for r in replies if r["turn"] == 0]
    assert len(first_turn) == 2 and len({r["parent_id"] for r in first_turn}) == 1
    assert await small_targets(page) == []
    await page.locator(".reply-meta .prev").tap()  # back to the first version: the second turn comes with it
    assert await page.locator(".reply-meta .version-label").first.inner_text() == "1/2"
    assert await page.locator(".msg.user").count() == 2
    await shot(page, "phone-02-versions")

    await page.locator(".msg.user .edit").first.tap()
    box = page.get_by_role("textbox", name="Edit message")
    await box.fill("Name a berry.")
    assert await small_targets(page) == []
    await page.locator(".edit-box button.primary").tap()
    await until(page, "document.querySelector('.user-meta .version-label')?.textContent === '2/2'")
    await wait_done(page)
    assert await page.locator(".msg.user .bubble").first.inner_text() == "Name a berry."
    assert await overflow(page) == []


async def test_the_drawer_menu_renames_shares_exports_and_deletes(make_page: Page, http: httpx.AsyncClient,
                                                                  alice: Caller) -> None:
    r = await http.post("/v1/conversations", headers=alice.headers, json={"title": "Trip notes"})
    cid = r.json()["conversation_id"]
    page = await make_page("phone", **PHONE)
    await sign_in(page, alice)
    await send(page, "Name a harbour.")  # a conversation with a message, open on screen
    await wait_done(page)
    open_id = await conversation_id(page)
    seen = answer_dialogs(page, ["Harbour notes", ""])
    item = page.locator("#conversation-list li", has=page.locator(f"a[href='#/c/{cid}']"))

    async def menu(action: str) -> None:
        await open_drawer(page, "phone")
        await item.locator(".conversation-more").tap()
        assert await small_targets(page) == []
        await item.locator(f".conversation-menu button.{action}").tap()

    await open_drawer(page, "phone")
    assert await item.locator(".conversation-more").is_visible()  # shown without hovering
    await item.locator(".conversation-more").tap()
    await shot(page, "phone-03-conversation-menu")
    await page.keyboard.press("Escape")  # closes the menu, not the drawer
    assert await item.locator(".conversation-menu").count() == 0
    await until(page, "document.querySelector('#app').classList.contains('drawer-open')", 5)

    await item.locator(".conversation-more").tap()
    await item.locator(".conversation-menu button.rename").tap()
    await until(page, f"document.querySelector(\"a[href='#/c/{cid}']\").textContent === 'Harbour notes'")
    titles = {c["conversation_id"]: c["title"]
              for c in (await http.get("/v1/conversations", headers=alice.headers)).json()["items"]}
    assert titles[cid] == "Harbour notes"

    # Share the open conversation from its own entry in the list: the dialog makes a link anyone can read.
    opened = page.locator("#conversation-list li", has=page.locator(f"a[href='#/c/{open_id}']"))
    await open_drawer(page, "phone")
    await opened.locator(".conversation-more").tap()
    await opened.locator(".conversation-menu button.share").tap()
    await page.locator("#share-dialog").wait_for(state="visible")
    await page.locator("#share-create").tap()
    await until(page, "document.querySelector('#share-link').value.includes('/s/')")
    assert await small_targets(page) == []
    await shot(page, "phone-04-share-dialog")
    link = await page.locator("#share-link").input_value()
    async with httpx.AsyncClient() as anyone:  # no account, no cookie
        shared = await anyone.get(link.replace("/s/", "/v1/shares/"))
    assert shared.status_code == 200 and shared.json()["messages"][0]["content"] == "Name a harbour."
    await page.locator("#share-close").tap()

    for action, kind in (("export-md", "md"), ("export-json", "json")):
        async with page.expect_download() as info:
            await menu(action)
        download = await info.value
        assert download.suggested_filename.endswith(f".{kind}")
        text = open(await download.path(), encoding="utf-8").read()  # noqa: SIM115 - a temporary file
        if kind == "json":
            assert json.loads(text)["conversation_id"] == cid
        else:
            assert "Harbour notes" in text

    await menu("delete")
    await until(page, f"!document.querySelector(\"a[href='#/c/{cid}']\")")
    assert "Harbour notes" in seen[1]
    assert (await http.get(f"/v1/conversations/{cid}/messages", headers=alice.headers)).status_code == 404


async def test_wide_tables_and_code_scroll_sideways_without_breaking_words(make_page: Page, alice: Caller) -> None:
    page = await make_page("phone", **PHONE)
    await play(page, "g-wide", WIDE)
    await sign_in(page, alice)
    await send(page, "Show me a wide table.")
    await wait_done(page)
    assert "Fruitbasketwithoutspaces" in await reply_text(page)
    boxes = await page.evaluate("""() => {
      const wrap = document.querySelector('.md .table-wrap'), pre = document.querySelector('.md pre');
      const cells = [...document.querySelectorAll('.md td')];
      return { table: [wrap.scrollWidth, wrap.clientWidth], code: [pre.scrollWidth, pre.clientWidth],
               broken: cells.filter((td) => td.scrollWidth > td.clientWidth + 1
                                           || td.getClientRects().length !== 1
                                           || td.getBoundingClientRect().height > 2.2 * parseFloat(
                                                getComputedStyle(td).lineHeight)).map((td) => td.textContent) };
    }""")
    assert boxes["table"][0] > boxes["table"][1], boxes  # wider than the phone: it scrolls in its box
    assert boxes["code"][0] > boxes["code"][1], boxes
    assert boxes["broken"] == [], boxes  # every cell one line, its word whole ("Frui t" was the defect)
    assert await overflow(page) == []  # the page itself does not scroll sideways
    await page.locator(".md .table-wrap").evaluate("(e) => { e.scrollLeft = e.scrollWidth; }")
    await shot(page, "phone-05-wide-table")
