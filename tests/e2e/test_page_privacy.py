"""Rename and delete from the chat page's sidebar, in the real browser against the whole service."""
from __future__ import annotations

from typing import Any

import httpx

from tests.e2e.browser import shot, sign_in, until
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
