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


HOSTILE = ("Some **bold**: <script>window.pwned=1</script> <img src=x onerror=\"window.pwned=2\"> "
           "[bad](javascript:window.pwned=3)")


async def test_a_shared_conversation_shows_script_as_text(open_page: OpenPage, http: httpx.AsyncClient,  # noqa: F811
                                                          alice: Caller) -> None:
    """/s/<id> with no sign-in: what was written is shown as its characters, a reply's Markdown rendered by the
    page's own renderer, and nothing in either runs."""
    made = await http.post("/v1/conversations", headers=alice.headers, json={"title": HOSTILE})
    cid = made.json()["conversation_id"]
    async with http.stream("POST", f"/v1/conversations/{cid}/messages", headers=alice.headers,
                           json={"content": HOSTILE, "max_tokens": 4}) as r:
        assert r.status_code == 200
        await r.aread()
    await saved_replies(http, alice, cid)
    share = (await http.post(f"/v1/conversations/{cid}/share", headers=alice.headers)).json()
    page = await open_page()

    async def reply_says_it_too(route: Any) -> None:  # the model will not write script on request: make it
        response = await route.fetch()
        body = await response.json()
        body["messages"][-1]["content"] = HOSTILE
        await route.fulfill(response=response, json=body)

    await page.route(f"**/v1/shares/{share['share_id']}", reply_says_it_too)
    await page.goto(share["path"])
    await until(page, "document.querySelectorAll('#shared-messages article').length === 2")
    await shot(page, "safety-03-shared")
    shown = page.locator("#shared-messages")
    assert await page.evaluate("window.pwned") is None
    assert await shown.locator("script, img, [onerror], a[href^='javascript']").count() == 0
    assert await page.locator("#shared-messages .msg.user .bubble").inner_text() == HOSTILE
    # who speaks, for a screen reader: read before each message, hidden from sight
    assert await shown.locator(".sr-only").all_text_contents() == ["They said:", "Parley replied:"]
    assert (await shown.locator(".sr-only").first.bounding_box() or {"width": 0})["width"] <= 1
    reply = page.locator("#shared-messages .msg.assistant .md")
    assert await reply.locator("strong").inner_text() == "bold"
    assert "<script>window.pwned=1</script>" in await reply.inner_text()
    assert await page.locator("#shared-title").inner_text() == HOSTILE
