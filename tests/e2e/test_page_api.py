"""API traffic is not page traffic: a conversation made by the OpenAI endpoint is not in the page's
sidebar, in a real browser."""
from __future__ import annotations

import asyncio

import httpx
import openai

from tests.e2e.browser import shot, sign_in, until
from tests.e2e.conftest import Caller
from tests.e2e.service import Service
from tests.e2e.test_page import OpenPage, browser, open_page  # noqa: F401 - the page tests' fixtures


async def test_api_conversations_are_not_in_the_sidebar(open_page: OpenPage, service: Service,  # noqa: F811
                                                        http: httpx.AsyncClient, alice: Caller) -> None:
    r = await http.post("/v1/conversations", headers=alice.headers, json={"title": "Made on the page"})
    assert r.status_code == 201
    made_here = r.json()["conversation_id"]
    async with openai.AsyncOpenAI(base_url=f"{service.url('gateway-a')}/v1", api_key=alice.token,
                                  max_retries=0, timeout=120) as client:
        await client.chat.completions.create(model="large", max_tokens=4,
                                             messages=[{"role": "user", "content": "Made by the API"}])
        await client.responses.create(model="large", input="Made by the Responses API", max_output_tokens=4)
    # They exist, listed over the API with the filter once their replies are saved (persistence, a moment after
    # the client has the reply).
    deadline = asyncio.get_running_loop().time() + 30
    while len(api := (await http.get("/v1/conversations", params={"source": "api"},
                                     headers=alice.headers)).json()["items"]) < 2:
        assert asyncio.get_running_loop().time() < deadline, api
        await asyncio.sleep(0.2)
    assert len(api) == 2
    # And, like the sidebar, its search leaves them out (they are not indexed). "made" is in all three: the same
    # search finds the page's conversation, so an empty answer from a search that finds nothing cannot pass.
    found = (await http.get("/v1/search", params={"q": "made"}, headers=alice.headers)).json()["items"]
    assert {h["conversation_id"] for h in found} == {made_here}, found
    found = (await http.get("/v1/search", params={"q": "api"}, headers=alice.headers)).json()["items"]
    assert found == []
    page = await open_page()
    await sign_in(page, alice)
    await until(page, "document.querySelectorAll('#conversation-list a').length >= 1")
    await page.wait_for_timeout(500)  # any later page of the list would have arrived by now
    await shot(page, "30-sidebar-without-api-conversations")
    titles = [t.strip() for t in await page.locator("#conversation-list a").all_inner_texts()]
    assert titles == ["Made on the page"]
