"""The chat page in a real browser when the output check cuts a reply: the text it showed is replaced by
the notice, and reopening the conversation shows the notice, never the text."""
from __future__ import annotations

import json
from typing import Any

import httpx

from tests.e2e.browser import REPLY, conversation_id, reply_text, saved_replies, send, shot, sign_in, until, wait_done
from tests.e2e.conftest import Caller
from tests.e2e.test_page import OpenPage, browser, open_page  # noqa: F401 - the page fixtures
from tests.e2e.test_safety import GREEDY, NOTICE, QUESTION

WATCH = """() => {
  window.sawText = false;
  const look = () => {
    const shown = [...document.querySelectorAll('article.msg.assistant .md')].map((e) => e.textContent).join(' ');
    if (shown.trim()) window.sawText = true;
  };
  new MutationObserver(look).observe(document.querySelector('#messages'),
                                     { subtree: true, childList: true, characterData: true });
  return true;
}"""


async def _greedy(route: Any) -> None:
    """The page's send, with temperature 0 added: sampled, the model may not say the flagged phrase."""
    request = route.request
    if request.method != "POST":
        await route.fallback()
        return
    await route.continue_(post_data=json.dumps({**json.loads(request.post_data), **GREEDY}))


async def test_the_page_replaces_a_retracted_reply_with_the_notice(open_page: OpenPage,  # noqa: F811
                                                                   http: httpx.AsyncClient, alice: Caller) -> None:
    page = await open_page()
    await page.route("**/v1/conversations/*/messages", _greedy)
    await sign_in(page, alice)
    await page.evaluate(WATCH)
    await send(page, QUESTION)
    await wait_done(page)
    await shot(page, "safety-01-retracted")
    # The reply was on screen (hold-back 0) before it was withdrawn. The flagged sentence's last words can come
    # in the same flush window as its retraction, so the page may replace them before it ever paints them.
    assert await page.evaluate("window.sawText")
    assert "solar" not in (await reply_text(page)).lower()
    assert await page.locator(f"{REPLY} .notice").last.inner_text() == NOTICE
    assert await page.locator(f"{REPLY} .status").last.inner_text() == "Removed by the content rules"

    cid = await conversation_id(page)
    [saved] = await saved_replies(http, alice, cid)
    assert (saved["status"], saved["content"]) == ("blocked", NOTICE)
    again = await open_page()
    await sign_in(again, alice)
    await again.goto(f"/#/c/{cid}")
    await until(again, f"document.querySelector('{REPLY}.blocked')")
    await shot(again, "safety-02-reopened")
    assert await reply_text(again) == NOTICE
    assert await again.locator(f"{REPLY} .status").last.inner_text() == "Removed by the content rules"
