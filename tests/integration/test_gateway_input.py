"""Hostile input against a real gateway (Kafka, Cassandra, Redis): refused with the documented error,
before any store sees it, and never a 5xx. Decisions and token events are produced by the test, as the
stages would produce them."""
from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from aiokafka import AIOKafkaProducer

from infra.config.settings import Settings
from infra.stores import keys
from infra.stores.accounts import Accounts
from infra.stores.session import AsyncSession
from schemas import (
    GenerationFinished,
    GenerationQueued,
    MessageSubmitted,
    RequestRefused,
    TokensAppended,
    Usage,
    decode,
    new_id,
)
from tests.integration.gateway_server import serve
from topics import Topics
from topics.clients import assign_at_end, make_consumer, make_producer, send
from topics.partitioning import partition_for


@dataclass
class Env:
    url: str
    settings: Settings
    headers: dict[str, str]
    user_id: str
    db: AsyncSession


@pytest.fixture
def gateway(settings: Settings, tmp_path: Path) -> Iterator[tuple[str, Settings]]:
    gw_settings = settings.with_(state_dir=tmp_path, admission_wait_s=1.0)
    with serve(gw_settings) as url:
        yield url, gw_settings


@pytest.fixture
async def env(gateway: tuple[str, Settings], db: AsyncSession) -> Env:
    user, token = await Accounts(db).create_user("free")
    return Env(gateway[0], gateway[1], {"Authorization": f"Bearer {token}"}, user.user_id, db)


@pytest.fixture
async def producer(settings: Settings) -> AsyncIterator[AIOKafkaProducer]:
    p = make_producer(settings.kafka_bootstrap)
    await p.start()
    yield p
    await p.stop()


def error_of(r: httpx.Response) -> dict[str, object]:
    body = r.json()
    assert set(body) == {"error"} and {"code", "message"} <= set(body["error"]), body
    return body["error"]  # type: ignore[no-any-return]


async def new_conversation(http: httpx.AsyncClient, env: Env) -> str:
    r = await http.post("/v1/conversations", headers=env.headers)
    assert r.status_code == 201
    return r.json()["conversation_id"]  # type: ignore[no-any-return]


async def test_forged_cursors_are_400_and_cassandra_keeps_answering(env: Env) -> None:
    async with httpx.AsyncClient(base_url=env.url, timeout=30) as http:
        convs = []
        for i in range(3):  # named, so listed before any reply
            r = await http.post("/v1/conversations", headers=env.headers, json={"title": f"Trip {i}"})
            assert r.status_code == 201
            convs.append(r.json()["conversation_id"])
        for bad in ("null", "AAAA", "AAAA.AAAA", "%%%", "x" * 5000, "bnVsbA.c2lnbmF0dXJl"):
            r = await http.get("/v1/conversations", params={"cursor": bad}, headers=env.headers)
            assert r.status_code == 400 and error_of(r)["code"] == "bad_cursor", (bad, r.text)
            r = await http.get(f"/v1/conversations/{convs[0]}/messages", params={"cursor": bad}, headers=env.headers)
            assert r.status_code == 400 and error_of(r)["code"] == "bad_cursor"
        # Cassandra never saw them: the next request answers at once, no 503.
        r = await http.get("/v1/conversations", params={"limit": 2}, headers=env.headers)
        assert r.status_code == 200 and len(r.json()["items"]) == 2
        cursor = r.json()["next_cursor"]
        r2 = await http.get("/v1/conversations", params={"limit": 2, "cursor": cursor}, headers=env.headers)
        assert r2.status_code == 200
        assert {c["conversation_id"] for c in r.json()["items"] + r2.json()["items"]} == set(convs)
        # A good cursor is bound to its list: another user (or another conversation) cannot use it.
        other, other_token = await Accounts(env.db).create_user("free")
        r3 = await http.get("/v1/conversations", params={"cursor": cursor},
                            headers={"Authorization": f"Bearer {other_token}"})
        assert r3.status_code == 400 and error_of(r3)["code"] == "bad_cursor"


async def test_lone_surrogates_are_422_on_both_send_endpoints(env: Env) -> None:
    body = b'{"content": "hi \\ud800 there"}'
    async with httpx.AsyncClient(base_url=env.url, timeout=30) as http:
        conv = await new_conversation(http, env)
        r = await http.post(f"/v1/conversations/{conv}/messages", content=body,
                            headers=env.headers | {"content-type": "application/json"})
        assert r.status_code == 422 and "content" in error_of(r)["message"]
        r = await http.post("/v1/chat/completions", headers=env.headers | {"content-type": "application/json"},
                            content=b'{"model": "large", "messages": [{"role": "user", "content": "\\udfff"}]}')
        assert r.status_code == 422
        assert r.json()["error"]["param"] == "messages[0].content" and r.json()["error"]["code"] == "invalid_text"


async def test_framework_errors_use_the_documented_shape(env: Env) -> None:
    async with httpx.AsyncClient(base_url=env.url, timeout=30) as http:
        conv = await new_conversation(http, env)
        send_url = f"/v1/conversations/{conv}/messages"
        json_headers = env.headers | {"content-type": "application/json"}
        r = await http.post(send_url, content=b'{"content": "caf\xe9"}', headers=json_headers)
        assert r.status_code == 422 and error_of(r)["code"] == "invalid_json"
        r = await http.post(send_url, content=b"[" * 5000 + b"]" * 5000, headers=json_headers)
        assert r.status_code == 422 and error_of(r)["code"] == "invalid_json"
        r = await http.get("/no-such-thing", headers=env.headers)
        assert r.status_code == 404 and error_of(r)["code"] == "not_found"
        r = await http.get("/v1/no-such-thing", headers=env.headers)  # an OpenAI client's guess: OpenAI's shape
        assert r.status_code == 404 and error_of(r)["code"] == "unknown_url"
        r = await http.delete("/v1/conversations", headers=env.headers)
        assert r.status_code == 405 and error_of(r)["code"] == "method_not_allowed" and r.headers["allow"]
        r = await http.post("/v1/session/demo", json={"plan": "paid"})
        assert r.status_code == 422 and error_of(r)["code"] == "invalid_request"


async def test_the_openapi_schema_lists_each_routes_error_statuses(env: Env) -> None:
    async with httpx.AsyncClient(base_url=env.url, timeout=30) as http:
        paths = (await http.get("/openapi.json")).json()["paths"]
    send = paths["/v1/conversations/{conversation_id}/messages"]["post"]["responses"]
    assert {"200", "401", "404", "409", "413", "422", "429", "503"} <= set(send)
    assert {"200", "400", "401", "503"} <= set(paths["/v1/conversations"]["get"]["responses"])
    assert {"400", "401", "404", "429", "503"} <= set(paths["/v1/chat/completions"]["post"]["responses"])


async def _decider(settings: Settings, producer: AIOKafkaProducer, topics: Topics,
                   refuse: bool = True) -> asyncio.Task[str]:
    """Play the stages once: the next MessageSubmitted is refused (or queued). Returns once it is listening."""
    consumer = make_consumer(settings.kafka_bootstrap, group_id=None)
    await consumer.start()
    await assign_at_end(consumer, [topics.requests])

    async def decide() -> str:
        try:
            while True:
                for records in (await consumer.getmany(timeout_ms=500)).values():
                    for record in records:
                        req = decode(record.value)
                        assert isinstance(req, MessageSubmitted) and req.deadline > req.at
                        ids = {"generation_id": req.generation_id, "conversation_id": req.conversation_id,
                               "user_id": req.user_id}
                        decision = RequestRefused(**ids, reason="daily_budget", message="No tokens left today.",
                                                  retry_after_s=60) if refuse else GenerationQueued(
                            **ids, pool="large", model="m", lane="free", position=0, estimated_wait_s=0)
                        await send(producer, topics.tokens, decision, key=req.generation_id)
                        return req.generation_id
        finally:
            await consumer.stop()

    return asyncio.create_task(decide())


async def test_a_refused_send_releases_its_client_message_id_and_other_content_is_409(
        env: Env, producer: AIOKafkaProducer, redis_client) -> None:  # type: ignore[no-untyped-def]
    topics = Topics(env.settings.topic_prefix)
    async with httpx.AsyncClient(base_url=env.url, timeout=30) as http:
        conv = await new_conversation(http, env)
        url, body = f"/v1/conversations/{conv}/messages", {"content": "hello", "client_message_id": "c-1"}
        for _ in range(2):  # the second try is refused afresh, not attached to the first generation
            refuser = await _decider(env.settings, producer, topics)
            r = await asyncio.wait_for(http.post(url, json=body, headers=env.headers), 20)
            assert r.status_code == 429 and error_of(r)["code"] == "daily_budget" and r.headers["retry-after"]
            await asyncio.wait_for(refuser, 30)
            assert await redis_client.get(keys.client_message(conv, "c-1")) is None
        # Queued: the id is taken, and other content is refused.
        queuer = await _decider(env.settings, producer, topics, refuse=False)
        async with http.stream("POST", url, json={"content": "first", "client_message_id": "c-2"},
                               headers=env.headers) as first:
            assert first.status_code == 200, (await first.aread()).decode()
        await asyncio.wait_for(queuer, 30)
        r = await asyncio.wait_for(http.post(url, json={"content": "second", "client_message_id": "c-2"},
                                             headers=env.headers), 20)
        assert r.status_code == 409 and error_of(r)["code"] == "client_message_id_reused"


async def test_no_decision_in_time_is_a_503_and_the_id_is_released(env: Env, redis_client) -> None:  # type: ignore[no-untyped-def]
    async with httpx.AsyncClient(base_url=env.url, timeout=30) as http:  # no stage answers behind this gateway
        conv = await new_conversation(http, env)
        began = asyncio.get_running_loop().time()
        r = await http.post(f"/v1/conversations/{conv}/messages", json={"content": "hi", "client_message_id": "c"},
                            headers=env.headers)
        waited = asyncio.get_running_loop().time() - began
    assert r.status_code == 503 and error_of(r)["code"] == "not_started" and r.headers["retry-after"] == "5"
    assert env.settings.admission_wait_s <= waited < env.settings.admission_wait_s + 5
    assert await redis_client.get(keys.client_message(conv, "c")) is None


async def _generation(env: Env, producer: AIOKafkaProducer, redis_client) -> tuple[str, list[int]]:  # type: ignore[no-untyped-def]
    """A finished generation in the token buffer, owned by the test's user: its events' offsets."""
    topics, gid, conv = Topics(env.settings.topic_prefix), new_id(), new_id()
    await redis_client.set(keys.generation_owner(gid), f"{env.user_id} {conv}")
    ids = {"generation_id": gid, "conversation_id": conv, "user_id": env.user_id}
    events = [GenerationQueued(**ids, pool="large", model="m", lane="free", position=0, estimated_wait_s=0),
              TokensAppended(**ids, seq=0, text="Hel", token_ids=[1]),
              TokensAppended(**ids, seq=1, text="lo", token_ids=[2]),
              GenerationFinished(**ids, plan="free", message_id="m", status="complete", text="Hello",
                                 usage=Usage(prompt_tokens=3, completion_tokens=2), model="m", pool="large",
                                 worker_id="w")]
    return gid, [(await send(producer, topics.tokens, e, key=gid)).offset for e in events]


async def _frames(http: httpx.AsyncClient, env: Env, gid: str, last_id: str) -> tuple[int, str]:
    """The whole response; a stream that does not end within 20 s fails the test."""
    async def read() -> tuple[int, str]:
        async with http.stream("GET", f"/v1/generations/{gid}/stream",
                               headers=env.headers | {"Last-Event-ID": last_id}) as r:
            return r.status_code, (await r.aread()).decode()

    return await asyncio.wait_for(read(), 20)


async def test_last_event_id_at_or_past_the_end_ends_the_stream_and_bad_ids_are_422(
        env: Env, producer: AIOKafkaProducer, redis_client) -> None:  # type: ignore[no-untyped-def]
    gid, offsets = await _generation(env, producer, redis_client)
    async with httpx.AsyncClient(base_url=env.url, timeout=15) as http:
        status, text = await _frames(http, env, gid, str(offsets[1]))  # mid-stream: the rest, then the end
        assert status == 200 and '"text":"lo"' in text and '"text":"Hel"' not in text and "message_end" in text
        for at_or_past in (offsets[-1], offsets[-1] + 1000):  # nothing replayed, the final state, the end
            status, text = await _frames(http, env, gid, str(at_or_past))
            assert status == 200 and "delta" not in text and '"stop_reason":"end"' in text, text
        for bad in ("-1", "-5", "abc"):
            status, text = await _frames(http, env, gid, bad)
            assert status == 422 and '"bad_last_event_id"' in text
        # Another generation's event in the same partition: no stream of this one sent that id.
        topics = Topics(env.settings.topic_prefix)
        partitions = len(await producer.partitions_for(topics.tokens))
        other = next(g for g in iter(new_id, None) if partition_for(g, partitions) == partition_for(gid, partitions))
        foreign = await send(producer, topics.tokens, TokensAppended(
            generation_id=other, conversation_id="c", user_id="u", seq=0, text="x", token_ids=[1]), key=other)
        status, text = await _frames(http, env, gid, str(foreign.offset))
        assert status == 422 and "another stream" in text
