"""What people do with a conversation on the page, at desktop and phone sizes, against the whole service:
edit and resend (a sibling message and a branch of its own), search, Escape to stop, focus kept on the
control that was used, the model picker following a reopened conversation, and sign-out that revokes."""
from __future__ import annotations

import uuid
from typing import Any

import httpx

from tests.e2e.browser import (
    REPLY,
    Page,
    conversation_id,
    open_drawer,
    reply_text,
    saved_replies,
    send,
    shot,
    sign_in,
    text_longer_than,
    until,
    wait_done,
)
from tests.e2e.conftest import Caller, eventually
from tests.e2e.service import Service

LONG = "Write a long story about a lighthouse keeper and the sea."
FOCUS = "document.activeElement?.dataset?.focus ?? document.activeElement?.id"


async def messages(http: httpx.AsyncClient, who: Caller, cid: str) -> list[dict[str, Any]]:
    r = await http.get(f"/v1/conversations/{cid}/messages", headers=who.headers)
    assert r.status_code == 200, r.text
    return list(r.json()["items"])


async def test_edit_and_resend_makes_a_branch_the_page_flips_between(make_page: Page, http: httpx.AsyncClient,
                                                                     alice: Caller, size: str) -> None:
    page = await make_page(size)
    await sign_in(page, alice)
    await send(page, "Name a fruit.")
    await wait_done(page)
    first = await reply_text(page)
    cid = await conversation_id(page)
    await until(page, "document.querySelector('.msg.user .edit')")  # once the message has its saved id
    await page.locator(".msg.user .edit").click()
    box = page.get_by_role("textbox", name="Edit message")
    assert await box.input_value() == "Name a fruit."
    await box.fill("Name a vegetable.")
    await box.press("Enter")
    await until(page, "document.querySelector('.user-meta .version-label')?.textContent === '2/2'")
    await wait_done(page)
    assert await page.locator(".msg.user .bubble").last.inner_text() == "Name a vegetable."
    await shot(page, f"30-edited-2-of-2-{size}")

    await page.locator(".user-meta .prev").click()  # back to the first version: its own reply comes with it
    assert await page.locator(".user-meta .version-label").inner_text() == "1/2"
    assert await page.locator(".msg.user .bubble").last.inner_text() == "Name a fruit."
    assert await reply_text(page) == first
    assert await page.evaluate(FOCUS) == "u0next"  # focus stays in the switcher ("previous" is now disabled)
    await shot(page, f"31-edited-1-of-2-{size}")

    items = await messages(http, alice, cid)
    users = [m for m in items if m["role"] == "user"]
    assert [u["content"] for u in users] == ["Name a fruit.", "Name a vegetable."]
    assert users[0]["turn"] == users[1]["turn"] == 0 and users[0]["parent_id"] is users[1]["parent_id"] is None
    replies = {m["parent_id"]: m for m in items if m["role"] == "assistant"}
    assert set(replies) == {u["message_id"] for u in users}  # one reply each: two branches

    await send(page, "Why that one?")  # continues the branch on screen (the fruit), not the newest
    await wait_done(page)
    followup = next(m for m in await messages(http, alice, cid) if m["content"] == "Why that one?")
    assert followup["parent_id"] == replies[users[0]["message_id"]]["message_id"] and followup["turn"] == 1


async def test_search_finds_titles_and_message_text(make_page: Page, http: httpx.AsyncClient, alice: Caller,
                                                     size: str) -> None:
    word, title_word = f"zq{uuid.uuid4().hex[:8]}", f"tq{uuid.uuid4().hex[:8]}"
    r = await http.post("/v1/conversations", headers=alice.headers, json={"title": f"Notes on {title_word}"})
    titled = r.json()["conversation_id"]
    page = await make_page(size)
    await sign_in(page, alice)
    await send(page, f"What could {word} mean? Answer briefly.")
    await wait_done(page)
    cid = await conversation_id(page)

    async def indexed() -> Any:  # the exchange is indexed once its reply is saved
        hits = (await http.get("/v1/search", params={"q": word}, headers=alice.headers)).json()["items"]
        return hits or None

    assert await eventually(indexed, 60)
    await page.goto("/#/")
    await page.locator("#app").wait_for(state="visible")
    await open_drawer(page, size)
    typed = word[:7]  # a word's beginning is enough
    await page.locator("#search").fill(typed)
    await until(page, "document.querySelector('#search-results .hit mark')")
    marks = [m.lower() for m in await page.locator("#search-results mark").all_inner_texts()]
    assert any(word in m for m in marks) and all(typed in m for m in marks), marks  # the reply may echo it cut
    assert await page.locator("#conversation-list").is_hidden()
    await shot(page, f"32-search-{size}")
    # A message's hit: the title the small pool wrote may hold the word too, and a title's hit opens the
    # conversation without marking a message.
    await page.locator("#search-results a.hit[href*='/m/']").first.click()
    await until(page, "(id) => location.hash.startsWith(`#/c/${id}`) && document.querySelector('.msg.found')",
                30, cid)
    assert typed in (await page.locator(".msg.found").inner_text()).lower()

    await open_drawer(page, size)
    await page.locator("#search").fill(title_word.upper())
    await until(page, "(w) => [...document.querySelectorAll('#search-results .hit-title')]"
                      ".some((e) => e.textContent.includes(w))", 30, title_word)  # not the last search's list
    assert await page.locator("#search-results .hit-title").all_inner_texts() == [f"Notes on {title_word}"]
    assert await page.locator("#search-results a").get_attribute("href") == f"#/c/{titled}"
    await page.locator("#search").press("Escape")  # clears the search: the list comes back
    assert await page.locator("#conversation-list").is_visible() and await page.locator("#search").input_value() == ""


async def test_escape_stops_and_focus_stays_on_regenerate_and_versions(make_page: Page, http: httpx.AsyncClient,
                                                                       alice: Caller, size: str) -> None:
    page = await make_page(size)
    await sign_in(page, alice)
    await send(page, LONG)
    await text_longer_than(page, 10)
    await page.keyboard.press("Escape")  # focus is still in the message box
    await wait_done(page)
    assert await page.locator(f"{REPLY} .status").last.inner_text() == "Stopped"
    cid = await conversation_id(page)
    [saved] = await saved_replies(http, alice, cid)
    assert saved["status"] == "stopped"

    await page.locator(f"{REPLY} .regenerate").click()
    await until(page, "document.querySelector('.reply-meta .version-label')?.textContent === '2/2'")
    assert await page.evaluate(FOCUS) == "regen0"  # not dropped to <body> by the redraw
    await text_longer_than(page, 10)
    await page.keyboard.press("Escape")
    await wait_done(page)
    assert await page.evaluate(FOCUS) == "regen0"
    await page.locator(".reply-meta .prev").click()
    assert await page.evaluate(FOCUS) == "r0next"
    assert await page.locator(".reply-meta .version-label").inner_text() == "1/2"
    await page.keyboard.press("Enter")  # the focused "next" works from the keyboard
    assert await page.locator(".reply-meta .version-label").inner_text() == "2/2"
    assert await page.evaluate(FOCUS) == "r0prev"
    await shot(page, f"33-focus-kept-{size}")
    assert [m["status"] for m in await saved_replies(http, alice, cid)] == ["stopped", "stopped"]


async def test_the_model_picker_follows_the_reopened_conversation(make_page: Page, alice: Caller,
                                                                   size: str) -> None:
    page = await make_page(size)
    await sign_in(page, alice)
    await page.locator("#model").select_option("small")
    await send(page, "Say yes.")
    await wait_done(page)
    cid = await conversation_id(page)
    await open_drawer(page, size)
    await page.locator("#new-chat").click()
    await page.locator("#model").select_option("large")
    await open_drawer(page, size)
    await page.locator(f"#conversation-list a[href='#/c/{cid}']").click()
    await until(page, f"document.querySelector('{REPLY}')")
    assert await page.locator("#model").input_value() == "small"
    await page.reload()
    await until(page, f"document.querySelector('{REPLY}')")
    assert await page.locator("#model").input_value() == "small"


async def test_sign_out_revokes_the_cookie_and_cross_origin_posts_are_refused(make_page: Page, service: Service,
                                                                              alice: Caller, size: str) -> None:
    page = await make_page(size)
    await sign_in(page, alice)
    [cookie] = [c for c in await page.context.cookies() if c["name"] == "parley_session"]
    jar = {"parley_session": cookie["value"]}
    origin = service.url("gateway-a")
    async with httpx.AsyncClient(base_url=origin, cookies=jar) as stolen:
        assert (await stolen.get("/v1/conversations")).status_code == 200
        r = await stolen.post("/v1/conversations", json={}, headers={"Origin": "https://evil.example"})
        assert r.status_code == 403 and r.json()["error"]["code"] == "cross_origin"
        assert (await stolen.post("/v1/conversations", json={}, headers={"Origin": origin})).status_code == 201
        await open_drawer(page, size)
        await page.locator("#sign-out").click()
        await page.locator("#signin").wait_for(state="visible")
        await shot(page, f"34-signed-out-{size}")
        r = await stolen.get("/v1/conversations")
        assert r.status_code == 401  # the copy of the cookie died with the session
