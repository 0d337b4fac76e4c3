"""The chat path end to end: real Kafka, Cassandra, Redis, vLLM workers, stages, HTTP through uvicorn."""
from __future__ import annotations

import asyncio
import uuid

import httpx

from tests.e2e.client import collect, frames, text_of
from tests.e2e.conftest import Caller, eventually
from tests.e2e.service import Service

QUESTION = "Name three kinds of fruit."


async def new_conversation(http: httpx.AsyncClient, who: Caller) -> str:
    r = await http.post("/v1/conversations", headers=who.headers, json={})
    assert r.status_code == 201, r.text
    return r.json()["conversation_id"]


async def send(http: httpx.AsyncClient, who: Caller, cid: str, content: str = QUESTION, **extra: object):  # type: ignore[no-untyped-def]
    body = {"content": content, **extra}
    async with http.stream("POST", f"/v1/conversations/{cid}/messages", headers=who.headers, json=body) as r:
        assert r.status_code == 200, await r.aread()
        return await collect(r)


async def history(http: httpx.AsyncClient, who: Caller, cid: str) -> list[dict]:  # type: ignore[type-arg]
    r = await http.get(f"/v1/conversations/{cid}/messages", headers=who.headers)
    assert r.status_code == 200, r.text
    return r.json()["items"]


async def saved_reply(http: httpx.AsyncClient, who: Caller, cid: str, generation_id: str) -> dict | None:  # type: ignore[type-arg]
    async def check():  # type: ignore[no-untyped-def]
        items = await history(http, who, cid)
        done = [m for m in items if m["generation_id"] == generation_id and m["role"] == "assistant"
                and m["status"] != "generating"]
        return done[0] if done else None
    return await eventually(check, 60)


async def test_send_stream_and_reload_history(http: httpx.AsyncClient, alice: Caller) -> None:
    cid = await new_conversation(http, alice)
    fs = await send(http, alice, cid)
    start, end = fs[0], fs[-1]
    assert start.event == "message_start" and start.data["model"] and start.data["generation_id"]
    assert end.event == "message_end" and end.data["stop_reason"] in ("end", "length")
    deltas = [f for f in fs if f.event == "delta"]
    assert deltas and all(f.id is not None for f in deltas)
    assert [f.id for f in deltas] == sorted(f.id for f in deltas)  # ids are increasing Kafka offsets
    reply = await saved_reply(http, alice, cid, start.data["generation_id"])
    assert reply is not None and reply["content"] == text_of(fs)
    assert reply["usage"]["out"] == end.data["usage"]["out"] > 0 and reply["usage"]["in"] > 0
    user_msgs = [m for m in await history(http, alice, cid) if m["role"] == "user"]
    assert [m["content"] for m in user_msgs] == [QUESTION] and user_msgs[0]["status"] == "complete"
    assert reply["parent_id"] == user_msgs[0]["message_id"]
    async def newest():  # type: ignore[no-untyped-def]  # listed once persistence saved the reply
        items = (await http.get("/v1/conversations", headers=alice.headers)).json()["items"]
        return items[0]["conversation_id"] if items else None
    assert await eventually(newest, 10) == cid  # the conversation just used is newest

    async def titled():  # type: ignore[no-untyped-def]
        items = (await http.get("/v1/conversations", headers=alice.headers)).json()["items"]
        return next((c["title"] for c in items if c["conversation_id"] == cid and c["title"]), None)
    assert await eventually(titled, 60), "the small pool never titled the conversation"


async def test_stop_mid_reply_saves_partial_text(http: httpx.AsyncClient, alice: Caller, bob: Caller) -> None:
    cid = await new_conversation(http, alice)
    body = {"content": "Write a long story about a lighthouse keeper and the sea."}
    async with http.stream("POST", f"/v1/conversations/{cid}/messages", headers=alice.headers, json=body) as r:
        got = []
        async for f in frames(r):
            got.append(f)
            if f.event == "message_start":
                gid = f.data["generation_id"]
                other = await http.post(f"/v1/generations/{gid}/cancel", headers=bob.headers)
                assert other.status_code == 404  # someone else's generation looks missing
            if sum(1 for g in got if g.event == "delta") == 3:
                stop = await http.post(f"/v1/generations/{gid}/cancel", headers=alice.headers)
                assert stop.status_code == 202
            if f.event == "message_end":
                break
    assert got[-1].data["stop_reason"] == "stopped"
    assert got[-1].data["usage"]["out"] < 256  # the paid reply cap was not reached
    reply = await saved_reply(http, alice, cid, gid)
    assert reply["status"] == "stopped" and reply["content"] == text_of(got) and reply["content"]
    again = await http.post(f"/v1/generations/{gid}/cancel", headers=alice.headers)
    assert again.status_code == 202  # idempotent


async def test_resume_on_another_gateway_after_the_first_dies(service: Service, alice: Caller) -> None:
    victim = service.start_gateway(f"gateway-victim-{uuid.uuid4().hex[:4]}")
    survivor = service.url("gateway-b")
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{victim.port}", timeout=60) as a:
        cid = await new_conversation(a, alice)
        got = []
        async with a.stream("POST", f"/v1/conversations/{cid}/messages", headers=alice.headers,
                            json={"content": "Explain how bread dough rises, in detail."}) as r:
            async for f in frames(r):
                got.append(f)
                if sum(1 for g in got if g.event == "delta") == 4:
                    victim.kill()  # SIGKILL mid-reply
                    break
    gid = got[0].data["generation_id"]
    last_id = [f for f in got if f.id is not None][-1].id
    async with httpx.AsyncClient(base_url=survivor, timeout=120) as b:
        async with b.stream("GET", f"/v1/generations/{gid}/stream",
                            headers={**alice.headers, "Last-Event-ID": str(last_id)}) as r:
            assert r.status_code == 200
            rest = await collect(r)
        reply = await saved_reply(b, alice, cid, gid)
    ids = [f.id for f in got + rest if f.event == "delta"]
    assert len(ids) == len(set(ids)), "a delta was repeated"
    assert rest[-1].event == "message_end"
    assert text_of(got) + text_of(rest) == reply["content"]  # byte for byte, nothing missing or repeated


async def test_retry_with_same_client_message_id_makes_one_generation(http: httpx.AsyncClient, alice: Caller) -> None:
    cid = await new_conversation(http, alice)
    cmid = f"cm-{uuid.uuid4().hex}"
    first, second = await asyncio.gather(send(http, alice, cid, client_message_id=cmid),
                                         send(http, alice, cid, client_message_id=cmid))
    g1 = next(f.data["generation_id"] for f in first if f.event == "message_start")
    g2 = next(f.data["generation_id"] for f in second if f.event == "message_start")
    assert g1 == g2 and text_of(first) == text_of(second)
    await saved_reply(http, alice, cid, g1)
    items = await history(http, alice, cid)
    assert [m["role"] for m in items] == ["user", "assistant"]


async def test_regenerate_makes_a_sibling_and_model_switch_names_the_pool(http: httpx.AsyncClient,
                                                                          alice: Caller) -> None:
    cid = await new_conversation(http, alice)
    first = await send(http, alice, cid, model="large")
    g1 = first[0].data["generation_id"]
    await saved_reply(http, alice, cid, g1)
    user_id = next(m["message_id"] for m in await history(http, alice, cid) if m["role"] == "user")
    async with http.stream("POST", f"/v1/conversations/{cid}/messages/{user_id}/regenerate",
                           headers=alice.headers, json={"model": "small"}) as r:
        assert r.status_code == 200
        second = await collect(r)
    assert second[0].data["pool"] == "small" and first[0].data["pool"] == "large"
    g2 = second[0].data["generation_id"]
    reply2 = await saved_reply(http, alice, cid, g2)
    replies = [m for m in await history(http, alice, cid) if m["role"] == "assistant"]
    assert len(replies) == 2 and {m["parent_id"] for m in replies} == {user_id}
    assert {m["pool"] for m in replies} == {"large", "small"} and reply2["pool"] == "small"


async def test_reply_with_no_reader_is_cancelled(service: Service, http: httpx.AsyncClient, alice: Caller) -> None:
    cid = await new_conversation(http, alice)
    async with http.stream("POST", f"/v1/conversations/{cid}/messages", headers=alice.headers,
                           json={"content": "Count from 1 to 500, separated by commas.", "ignore_eos": True,
                                 # Runs to the cap (sampled, it once ended in 2 s), greedy: a sampled count once
                                 # wandered into text the output check blocked before the detector cancelled it.
                                 "temperature": 0}) as r:
        async for f in frames(r):
            if f.event == "message_start":
                gid = f.data["generation_id"]
                break  # the client goes away and never comes back
    reply = await saved_reply(http, alice, cid, gid)
    assert reply["status"] == "stopped", reply  # the abandoned-reply detector cancelled it


async def test_other_users_cannot_touch_my_things(http: httpx.AsyncClient, alice: Caller, bob: Caller) -> None:
    cid = await new_conversation(http, alice)
    fs = await send(http, alice, cid, content="Say hi.")
    gid = fs[0].data["generation_id"]
    listed = (await http.get("/v1/conversations", headers=bob.headers)).json()["items"]
    assert cid not in [c["conversation_id"] for c in listed]
    assert (await http.get(f"/v1/conversations/{cid}/messages", headers=bob.headers)).status_code == 404
    assert (await http.get(f"/v1/generations/{gid}/stream", headers=bob.headers)).status_code == 404
    assert (await http.post(f"/v1/generations/{gid}/cancel", headers=bob.headers)).status_code == 404
    r = await http.post(f"/v1/conversations/{cid}/messages", headers=bob.headers, json={"content": "hi"})
    assert r.status_code == 404
    missing = await http.get(f"/v1/conversations/{uuid.uuid4()}/messages", headers=bob.headers)
    assert missing.json() == (await http.get(f"/v1/conversations/{cid}/messages", headers=bob.headers)).json()


async def test_bad_inputs_get_clear_errors(http: httpx.AsyncClient, alice: Caller) -> None:
    cid = await new_conversation(http, alice)
    url = f"/v1/conversations/{cid}/messages"
    cases = [
        ({}, {"content": "hi"}, 401),
        ({"Authorization": "Bearer nope"}, {"content": "hi"}, 401),
        (alice.headers, {"content": "   "}, 422),
        (alice.headers, {"content": "x" * 40_000}, 413),
        (alice.headers, {"content": "hi", "model": "gpt-9"}, 422),
        (alice.headers, {"nothing": 1}, 422),
    ]
    for headers, body, status in cases:
        r = await http.post(url, headers=headers, json=body)
        assert r.status_code == status, (body, r.text)
        assert r.json()["error"]["message"], r.text
    r = await http.post(url, headers={**alice.headers, "Content-Type": "application/json"}, content=b"{not json")
    assert r.status_code == 422 and "JSON" in r.json()["error"]["message"]
    unknown = (await http.post(url, headers=alice.headers, json={"content": "hi", "model": "gpt-9"})).json()
    assert "large" in unknown["error"]["message"] and "small" in unknown["error"]["message"]
