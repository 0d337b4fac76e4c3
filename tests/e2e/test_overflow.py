"""Overload through the running service: a saturated pool overflows to the small one, then refuses, then the
last-resort tier answers its prepared questions.

The service here has one sequence per pool and no worker for ``large``, so the large pool's queue never drains:
it is a fleet at full load, with nothing faked. The small pool has a real vLLM worker until the test stops it.
"""
from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from consumers.scheduler.canned import CANNED_POOL, CannedReplies
from infra.config.settings import Settings
from tests.e2e.browser import REPLY, new_page, send, shot, sign_in, until, wait_done
from tests.e2e.client import Frame, collect, frames, text_of
from tests.e2e.conftest import ARTIFACTS, Caller, _make_user
from tests.e2e.service import Service, launch
from tests.e2e.test_chat import history, new_conversation, saved_reply

PLANS = Path(__file__).with_name("data") / "plans-overflow.toml"
LATE = 12  # users for step 4's attempts
FREE_LIMIT_S = 5.0  # plans-overflow.toml; before any reply ends the scheduler takes one to last 20 s


@pytest.fixture(scope="module")
def saturated(stack_settings: Settings) -> Iterator[Service]:
    svc = launch(stack_settings, ARTIFACTS / "e2e-logs", reader_timeout_s=600, plans_file=PLANS, pools=("small",),
                 PARLEY_POOL_LARGE_MAX_SEQS="1", PARLEY_POOL_SMALL_MAX_SEQS="1")
    yield svc
    svc.stop()


async def _replies_announced(metrics_port: int, count: int, timeout_s: float = 30.0) -> None:
    """Wait until a worker's metrics count ``count`` finished generations (counted after chat.replies acked)."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    seen = 0.0
    async with httpx.AsyncClient(timeout=5) as http:
        while asyncio.get_running_loop().time() < deadline:
            body = (await http.get(f"http://127.0.0.1:{metrics_port}/metrics")).text
            seen = sum(float(line.rsplit(" ", 1)[1]) for line in body.splitlines()
                       if line.startswith("parley_worker_replies_total{"))
            if seen >= count:
                return
            await asyncio.sleep(0.2)
    raise AssertionError(f"the worker announced {seen:.0f} finished generations in {timeout_s:.0f} s, not {count}")


# Notes, from inside the page, the first time a reply shows who answered it: its words and whether the reply
# was still being written then (a small model's reply can end within a poll's interval).
WATCH_ROUTE = """() => {
  window.routeSeen = null;
  new MutationObserver(() => {
    const line = document.querySelector('article.msg.assistant .route:not([hidden])');
    if (window.routeSeen || !line || !line.textContent) return;
    window.routeSeen = { text: line.textContent, generating: line.closest('article').classList.contains('generating') };
  }).observe(document.getElementById('messages'), { subtree: true, childList: true, characterData: true,
                                                    attributes: true });
}"""


async def _overflow_on_the_page(browser: Any, svc: Service, who: Caller) -> None:
    """The page says in the reply, as it streams, that small answered for the busy large pool; the picker stays
    on large for the next message, also after a reload."""
    problems: list[str] = []
    page = await new_page(browser, svc.url("gateway-a"), "desktop", problems)
    try:
        await sign_in(page, who)
        assert await page.locator("#model").input_value() == "large"
        await page.evaluate(WATCH_ROUTE)
        await send(page, "Name two kinds of boat.")
        seen = await until(page, "window.routeSeen", 60)
        assert seen["generating"], seen  # told from the reply's start, not after it ended
        assert seen["text"].startswith("large was busy, so small ("), seen
        await wait_done(page)
        await shot(page, "overflow-announced")
        assert await page.locator("#model").input_value() == "large"  # the person's pick, kept
        label = await page.locator(f"{REPLY} .model").last.inner_text()
        assert label.startswith("small · ") and f"small ({label[len('small · '):]}) answered" in seen["text"]
        await page.reload()
        await until(page, f"document.querySelector('{REPLY} .route:not([hidden])')", 60)
        assert "was busy, so small" in await page.locator(f"{REPLY} .route").inner_text()
        assert await page.locator("#model").input_value() == "large"  # a reopened fallback does not move it
        assert not problems, problems
    finally:
        await page.context.close()


@pytest.fixture
async def client(saturated: Service) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=saturated.url("gateway-a"), timeout=httpx.Timeout(120, connect=10)) as c:
        yield c


async def _hold(http: httpx.AsyncClient, who: Caller, content: str, until: str,
                started: asyncio.Queue[list[Frame]]) -> None:
    """Send, report the frames up to the first ``until`` event, then keep reading until cancelled:
    the reply stays wanted, so nothing cancels it as abandoned."""
    cid = await new_conversation(http, who)
    async with http.stream("POST", f"/v1/conversations/{cid}/messages", headers=who.headers,
                           json={"content": content}) as r:
        assert r.status_code == 200, await r.aread()
        got: list[Frame] = []
        async for f in frames(r):
            got.append(f)
            if f.event == until:
                break
        await started.put(got)
        async for _ in frames(r):
            pass


async def test_overflow_to_small_then_refusal_then_prepared_reply(saturated: Service, client: httpx.AsyncClient,
                                                                  browser: Any) -> None:
    users = {name: await _make_user(saturated.settings, plan) for name, plan in
             [("first", "free"), ("payer", "paid"), ("overflow", "free"), ("asker", "free"), ("viewer", "free")]}
    users.update({f"late{i}": await _make_user(saturated.settings, "free") for i in range(LATE)})
    held: list[asyncio.Task[None]] = []
    started: asyncio.Queue[list[Frame]] = asyncio.Queue()
    try:
        # 1. The large pool's one sequence is taken, and nothing will ever free it.
        held.append(asyncio.create_task(
            _hold(client, users["first"], "Describe a quiet harbour.", "message_start", started)))
        first = await asyncio.wait_for(started.get(), 60)
        assert first[0].event == "message_start" and first[0].data["pool"] == "large"

        # 2. Paid still queues on its own pool (20 s estimated, under its 30 s limit) and is told so.
        held.append(asyncio.create_task(_hold(client, users["payer"], "Describe a busy harbour.", "queued", started)))
        paid = await asyncio.wait_for(started.get(), 60)
        assert paid[0].data["pool"] == "large"
        queued = next(f for f in paid if f.event == "queued")
        assert queued.data["position"] >= 1 and queued.data["estimated_wait_s"] > FREE_LIMIT_S

        # 3. Free would wait past its 5 s limit on large: it overflows to small, which answers.
        cid = await new_conversation(client, users["overflow"])
        async with client.stream("POST", f"/v1/conversations/{cid}/messages", headers=users["overflow"].headers,
                                 json={"content": "Name two kinds of boat."}) as r:
            assert r.status_code == 200, await r.aread()
            answered = await collect(r)
        start = answered[0]
        assert start.event == "message_start" and start.data["pool"] == "small", start
        assert (start.data["route_reason"], start.data["requested_pool"]) == ("overflow", "large"), start
        assert answered[-1].event == "message_end" and answered[-1].data["stop_reason"] in ("end", "length")
        reply = await saved_reply(client, users["overflow"], cid, start.data["generation_id"])
        assert reply["pool"] == "small" and reply["route_reason"] == "overflow"
        assert reply["model"] == start.data["model"] and reply["content"] == text_of(answered)

        # 4. The small pool's replica goes away. Once its announcement has expired (3 s) the scheduler counts
        #    small as past every limit: a free request finds both pools past the free limit and is refused at
        #    once, with a time to come back. One sent before that may still wait on small, for good.
        # 3b. The same through the page, in a browser (before the replica goes).
        await _overflow_on_the_page(browser, saturated, users["viewer"])

        await _replies_announced(saturated.metrics_ports["worker-small"], 2)
        saturated.procs["worker-small"].kill(signal.SIGKILL)
        killed = asyncio.get_running_loop().time()
        refused, stuck = None, 0
        for attempt in range(LATE):
            who = users[f"late{attempt}"]
            cid = await new_conversation(client, who)
            t0 = asyncio.get_running_loop().time()
            async with client.stream("POST", f"/v1/conversations/{cid}/messages", headers=who.headers,
                                     json={"content": "Name a lighthouse."}) as r:
                if r.status_code == 503:
                    await r.aread()
                    refused, elapsed, refused_user = r, asyncio.get_running_loop().time() - t0, who
                    break
                # accepted: it can only have gone to the small pool's queue, where it now waits for good
                assert r.status_code == 200, await r.aread()
                start = (await collect(r, stop_after=1))[0]
                assert start.event == "message_start" and start.data["pool"] == "small", start
                stuck += 1
            await asyncio.sleep(1)
        assert refused is not None, f"never refused although both pools were past the free limit ({stuck} stuck)"
        print(f"refused {asyncio.get_running_loop().time() - killed:.1f} s after small's worker was killed; "
              f"{stuck} request(s) left waiting on small before")
        assert elapsed < 10, f"a refusal must come at once, not after {elapsed:.1f} s"
        assert int(refused.headers["retry-after"]) >= 1
        body = refused.json()
        assert "busy" in body["error"]["message"] and "limit" in body["error"]["message"], body
        # The refusal gave back the reservation and the running slot in the same step and cost nothing.
        usage = (await client.get("/v1/usage", headers=refused_user.headers)).json()
        assert (usage["reserved"], usage["running"], usage["used"]) == (0, 0, 0), usage
        refused_messages = [m for m in await history(client, refused_user, cid) if m["role"] == "assistant"]
        assert all(m["status"] != "generating" for m in refused_messages)  # the placeholder was ended

        # 5. A prepared question is still answered, marked as prepared, by no model, now that both pools are
        #    past the free limit (small for want of a replica, however short its queue of stuck requests looks).
        canned = CannedReplies.load()
        cid = await new_conversation(client, users["asker"])
        async with client.stream("POST", f"/v1/conversations/{cid}/messages", headers=users["asker"].headers,
                                 json={"content": "What can you do?"}) as r:
            assert r.status_code == 200, await r.aread()
            got = []
            async for f in frames(r):  # the first frame says who answers: a wrong one would never end
                got.append(f)
                assert got[0].data["pool"] == CANNED_POOL and got[0].data["route_reason"] == "canned", got[0]
                if f.event in ("message_end", "error"):
                    break
        assert got[-1].event == "message_end"
        saved = await saved_reply(client, users["asker"], cid, got[0].data["generation_id"])
        assert saved["content"] == canned.reply_for("What can you do?") and saved["pool"] == CANNED_POOL

        # 6. The user refused in step 4 can start two replies at once right after (prepared ones here:
        #    nothing else answers now); before, the refused request held one of the two slots for 5 minutes.
        async def prepared() -> int:
            conv = await new_conversation(client, refused_user)
            async with client.stream("POST", f"/v1/conversations/{conv}/messages", headers=refused_user.headers,
                                     json={"content": "What can you do?"}) as r:
                return r.status_code
        assert await asyncio.gather(prepared(), prepared()) == [200, 200]
    finally:
        for task in held:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
