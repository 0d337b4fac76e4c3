"""Rename and delete from the chat page's sidebar, and share, copy, revoke and export from the open
conversation's menu, in the real browser at desktop size against the whole service."""
from __future__ import annotations

from typing import Any

import httpx

from tests.e2e.browser import conversation_id, send, shot, sign_in, until, wait_done
from tests.e2e.conftest import Caller
from tests.e2e.test_page import OpenPage, browser, open_page  # noqa: F401 - the page fixtures

LINK = "#conversation-list a[href='#/c/{}']"
ITEM = "a[href='#/c/{}']"  # inside one list item


def answer_dialogs(page: Any, replies: list[str | None]) -> list[str]:
    """Answer the next dialogs in order (text for a prompt, "" to accept, None to dismiss); their messages."""
    seen: list[str] = []

    async def on_dialog(dialog: Any) -> None:
        seen.append(dialog.message)
        reply = replies.pop(0)
        await (dialog.dismiss() if reply is None else dialog.accept(reply))

    page.on("dialog", on_dialog)
    return seen


async def test_rename_and_delete_from_the_sidebar(open_page: OpenPage, http: httpx.AsyncClient,  # noqa: F811
                                                  alice: Caller) -> None:
    ids = []
    for title in ("Old name", "To be deleted"):
        r = await http.post("/v1/conversations", headers=alice.headers, json={"title": title})
        ids.append(r.json()["conversation_id"])
    keep, doomed = ids
    page = await open_page()
    await sign_in(page, alice)
    seen = answer_dialogs(page, ["Holiday plans", None, ""])
    await page.locator(LINK.format(keep)).wait_for()

    item = page.locator("#conversation-list li", has=page.locator(ITEM.format(keep)))
    await item.locator("button.conversation-more").click()  # each conversation's ⋯ menu
    await item.locator("button.rename").click()
    await until(page, f"document.querySelector(\"{LINK.format(keep)}\").textContent === 'Holiday plans'")
    titles = {c["conversation_id"]: c["title"]
              for c in (await http.get("/v1/conversations", headers=alice.headers)).json()["items"]}
    assert titles[keep] == "Holiday plans"
    await shot(page, "privacy-01-renamed")

    item = page.locator("#conversation-list li", has=page.locator(ITEM.format(doomed)))
    await item.locator("button.conversation-more").click()
    await item.locator("button.delete").click()  # dismissed: nothing happens
    assert await page.locator(LINK.format(doomed)).count() == 1
    await item.locator("button.conversation-more").click()
    await item.locator("button.delete").click()  # confirmed
    await until(page, f"!document.querySelector(\"{LINK.format(doomed)}\")")
    assert "erased for good" in seen[1] and "To be deleted" in seen[2]
    assert (await http.get(f"/v1/conversations/{doomed}/messages", headers=alice.headers)).status_code == 404
    await page.reload()
    await page.locator(LINK.format(keep)).wait_for()
    assert await page.locator(LINK.format(doomed)).count() == 0
    await shot(page, "privacy-02-deleted")


async def test_share_copy_revoke_and_export_from_the_open_conversations_menu(
        open_page: OpenPage, alice: Caller) -> None:  # noqa: F811
    page = await open_page()
    await page.context.grant_permissions(["clipboard-read", "clipboard-write"])
    await sign_in(page, alice)
    await send(page, "Name a river.")
    await wait_done(page)
    await conversation_id(page)
    await page.locator("#chat-menu-button").click()
    await page.locator("#share-open").click()
    await page.locator("#share-dialog").wait_for(state="visible")
    await page.locator("#share-create").click()
    await until(page, "document.querySelector('#share-link').value.includes('/s/')")
    link = await page.locator("#share-link").input_value()
    await page.locator("#share-copy").click()
    await until(page, "document.querySelector('#share-copy').textContent === 'Copied'")
    assert await page.evaluate("navigator.clipboard.readText()") == link
    await shot(page, "share-01-dialog")
    async with httpx.AsyncClient() as anyone:  # no account, no cookie
        shared = await anyone.get(link.replace("/s/", "/v1/shares/"))
        assert shared.status_code == 200 and shared.json()["messages"][0]["content"] == "Name a river."
        await page.locator("#share-revoke").click()
        await until(page, "document.querySelector('#share-note').textContent.includes('revoked')")
        assert (await anyone.get(link.replace("/s/", "/v1/shares/"))).status_code == 404
    assert await page.locator("#share-link-row").is_hidden()
    await page.locator("#share-close").click()

    for button, kind in (("#export-md", ".md"), ("#export-json", ".json")):
        await page.locator("#chat-menu-button").click()
        async with page.expect_download() as info:
            await page.locator(button).click()
        download = await info.value
        assert download.suggested_filename.endswith(kind)
        assert "Name a river." in open(await download.path(), encoding="utf-8").read()  # noqa: SIM115
