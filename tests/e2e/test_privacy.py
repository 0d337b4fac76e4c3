"""Delete, rename and retention through the whole service: a delete mid-reply stops it and hides the
conversation everywhere at once, the purge leaves no row and no Redis key, the Kafka copies stay
ciphertext nobody can open, no sent phrase is in clear in Cassandra's or Kafka's files or in any log,
a no-retention user streams and resumes but leaves no text, nobody deletes what is not theirs, and custom
instructions are sealed, reach new conversations' prompts and go with their deletion."""
from __future__ import annotations

import asyncio
import json
import subprocess
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from infra.config.settings import Settings
from infra.stores import keys
from infra.stores.crypto import KeyGone
from infra.stores.preferences import key_id
from infra.stores.sealing import Sealer, configured, is_sealed
from producers.gateway.responses_compat import generation_of as rc_generation
from schemas import ALL_EVENTS, ConversationPurged, EventDecodeError, decode_record
from tests.e2e.client import collect, frames, text_of
from tests.e2e.conftest import Caller, eventually
from tests.e2e.service import Service
from tests.e2e.test_chat import history, new_conversation, send
from topics import Topics
from topics.clients import make_consumer

LONG = "Write a long story about a lighthouse keeper named {} and the sea."
TABLES = ("messages", "messages_by_client_id", "summaries", "conversations", "conversation_keys")


SENT: list[str] = []  # every phrase this module sent: the last test greps every log for all of them


def phrase() -> str:
    SENT.append(f"okapi{uuid.uuid4().hex[:12]}")
    return SENT[-1]


@pytest.fixture
def sealer(service: Service, db: Any) -> Sealer:
    return configured(service.settings, db)


async def start_reply(http: httpx.AsyncClient, who: Caller, cid: str, content: str) -> tuple[Any, Any, list[Any]]:
    """A streaming POST read up to its first delta: (response context, frame iterator, frames so far)."""
    ctx = http.stream("POST", f"/v1/conversations/{cid}/messages", headers=who.headers, json={"content": content})
    r = await ctx.__aenter__()
    assert r.status_code == 200, await r.aread()
    it, got = frames(r), []
    async for f in it:
        got.append(f)
        if f.event == "delta" or f.event in ("message_end", "error"):
            break
    assert got[-1].event == "delta", got
    return ctx, it, got


async def raw_records(settings: Settings, cid: str) -> list[Any]:
    """Every record of ``cid`` in chat.requests, chat.tokens and chat.replies, read from the beginning."""
    t = Topics(settings.topic_prefix)
    reader = make_consumer(settings.kafka_bootstrap, t.requests, t.tokens, t.replies, group_id=None)
    await reader.start()
    found: list[Any] = []
    try:
        idle = 0
        while idle < 4:
            batch = await reader.getmany(timeout_ms=500)
            idle = 0 if batch else idle + 1
            for records in batch.values():
                for r in records:
                    try:
                        event = decode_record(r, ALL_EVENTS)
                    except EventDecodeError:
                        continue
                    if getattr(event, "conversation_id", None) == cid:
                        found.append((r.value, event))
    finally:
        await reader.stop()
    return found


async def rows_of(db: Any, cid: str) -> dict[str, int]:
    counts = {t: len(await db.execute(f"SELECT * FROM {t} WHERE conversation_id = ?", (cid,))) for t in TABLES}
    return {t: n for t, n in counts.items() if n}


async def test_delete_mid_reply_hides_everywhere_stops_it_and_purges(
        service: Service, http: httpx.AsyncClient, alice: Caller, bob: Caller, db: Any, redis_client: Any,
        sealer: Sealer) -> None:
    secret = phrase()
    cid = await new_conversation(http, alice)
    live = await new_conversation(http, bob)
    live_fs = await send(http, bob, live, f"Say hello to {secret}x.")
    ctx, it, got = await start_reply(http, alice, cid, LONG.format(secret))
    gid = got[0].data["generation_id"]
    try:
        assert (await http.delete(f"/v1/conversations/{cid}", headers=bob.headers)).status_code == 404
        assert (await http.patch(f"/v1/conversations/{cid}", headers=bob.headers,
                                 json={"title": "mine"})).status_code == 404
        r = await http.delete(f"/v1/conversations/{cid}", headers=alice.headers)
        assert r.status_code == 204
        # Hidden at once, on either gateway.
        other = service.url("gateway-b")
        listed = (await http.get("/v1/conversations", headers=alice.headers)).json()["items"]
        assert cid not in [c["conversation_id"] for c in listed]
        for url in (f"/v1/conversations/{cid}/messages", f"{other}/v1/conversations/{cid}/messages"):
            assert (await http.get(url, headers=alice.headers)).status_code == 404
        assert (await http.get(f"/v1/generations/{gid}/stream", headers=alice.headers)).status_code == 404
        assert (await http.post(f"/v1/generations/{gid}/cancel", headers=alice.headers)).status_code == 404
        assert (await http.post(f"/v1/conversations/{cid}/messages/{gid}/regenerate",
                                headers=alice.headers)).status_code == 404
        assert (await http.post(f"/v1/conversations/{cid}/messages", headers=alice.headers,
                                json={"content": "more"})).status_code == 404
        assert (await http.patch(f"/v1/conversations/{cid}", headers=alice.headers,
                                 json={"title": "x"})).status_code == 404
        assert (await http.delete(f"/v1/conversations/{cid}", headers=alice.headers)).status_code == 204  # again
        # The reply that was streaming is stopped.
        rest = []
        async for f in it:
            rest.append(f)
            if f.event in ("message_end", "error"):
                break
        assert rest and rest[-1].event == "message_end" and rest[-1].data["stop_reason"] == "stopped", rest[-3:]
    finally:
        await ctx.__aexit__(None, None, None)

    # The purge: no row in any table, no Redis key, and the audit record.
    async def purged() -> bool:
        return not await rows_of(db, cid)
    assert await eventually(purged, 60), await rows_of(db, cid)
    assert not await db.execute("SELECT * FROM generations WHERE generation_id = ?", (gid,))
    for name in (keys.generation_owner(gid), keys.reader_heartbeat(gid), keys.generation_started(gid),
                 keys.conversation_generations(cid), keys.title_requested(cid)):
        assert not await redis_client.exists(name), name
    assert not [k async for k in redis_client.scan_iter(match=keys.client_message(cid, "*"))]
    audit = [e for _, e in await raw_audit(service.settings) if e.conversation_id == cid]
    assert audit and audit[0].reason == "user" and audit[0].removed["messages"] >= 2
    # Deleting again after the purge is still a success for the owner, and still a 404 for anyone else.
    assert (await http.delete(f"/v1/conversations/{cid}", headers=alice.headers)).status_code == 204
    assert (await http.delete(f"/v1/conversations/{cid}", headers=bob.headers)).status_code == 404

    # Kafka still holds its records, and nobody can open them; the live conversation's open.
    records = await raw_records(service.settings, cid)
    kinds = {type(e).__name__ for _, e in records}
    assert {"MessageSubmitted", "TokensAppended", "GenerationFinished"} <= kinds, kinds
    assert not any(secret.encode() in raw for raw, _ in records)
    sealed = [e for _, e in records if type(e).__name__ in ("MessageSubmitted", "TokensAppended")]
    for event in sealed:
        with pytest.raises(KeyGone):
            await sealer.open(event)
    opened = [await sealer.open(e) for _, e in await raw_records(service.settings, live)]
    assert any(getattr(e, "content", "") == f"Say hello to {secret}x." for e in opened)
    reply_gid = live_fs[0].data["generation_id"]  # (its title's tokens share the conversation)
    assert "".join(e.text for e in opened if type(e).__name__ == "TokensAppended"
                   and e.generation_id == reply_gid) == text_of(live_fs)


async def raw_audit(settings: Settings) -> list[Any]:
    reader = make_consumer(settings.kafka_bootstrap, Topics(settings.topic_prefix).purges, group_id=None)
    await reader.start()
    try:
        batch = await reader.getmany(timeout_ms=3000)
        return [(r.value, decode_record(r, (ConversationPurged,))) for rs in batch.values() for r in rs]
    finally:
        await reader.stop()


async def test_no_retention_streams_and_resumes_but_keeps_no_text(
        service: Service, http: httpx.AsyncClient, db: Any) -> None:
    from tests.e2e.conftest import _make_user

    carol = await _make_user(service.settings, "private")
    secret = phrase()
    cid = await new_conversation(http, carol)
    ctx, it, got = await start_reply(http, carol, cid, LONG.format(secret))
    await ctx.__aexit__(None, None, None)  # the connection drops mid-reply
    gid, last = got[0].data["generation_id"], got[-1].id
    async with http.stream("GET", f"{service.url('gateway-b')}/v1/generations/{gid}/stream",
                           headers={**carol.headers, "Last-Event-ID": str(last)}) as r:
        assert r.status_code == 200
        resumed = await collect(r)
    assert resumed[-1].event == "message_end" and text_of(resumed)
    assert [f.id for f in resumed if f.event == "delta"][0] > last  # nothing repeated

    async def key_gone() -> bool:
        return not await db.execute("SELECT * FROM conversation_keys WHERE conversation_id = ?", (cid,))
    assert await eventually(key_gone, 30)  # destroyed when the reply ended
    assert (await http.get("/v1/conversations", headers=carol.headers)).json()["items"] == []
    assert not await db.execute("SELECT * FROM messages WHERE conversation_id = ?", (cid,))
    assert not await db.execute("SELECT * FROM summaries WHERE conversation_id = ?", (cid,))
    row = (await db.execute("SELECT title FROM conversations WHERE conversation_id = ?", (cid,)))[0]
    assert row.title is None


async def test_rename_and_delete_every_conversation_of_an_account(http: httpx.AsyncClient, alice: Caller,
                                                                   bob: Caller) -> None:
    # Three kinds: renamed before any reply (renaming lists it), one with a reply (listed by it), and one never
    # listed (its only send was refused for being too long): delete-all reaches every one.
    first, second, unlisted = [await new_conversation(http, alice) for _ in range(3)]
    assert (await http.patch(f"/v1/conversations/{first}", headers=alice.headers,
                             json={"title": "  "})).status_code == 422
    assert (await http.patch(f"/v1/conversations/{first}", headers=alice.headers,
                             json={"title": "x" * 201})).status_code == 422
    r = await http.patch(f"/v1/conversations/{first}", headers=alice.headers, json={"title": " Trip  plans "})
    assert r.status_code == 200 and r.json()["title"] == "Trip plans"
    listed = (await http.get("/v1/conversations", headers=alice.headers)).json()["items"]
    assert [(c["title"], c["source"]) for c in listed if c["conversation_id"] == first] == [("Trip plans", "page")]
    text_of(await send(http, alice, second, f"Hi {phrase()}"))
    r = await http.post(f"/v1/conversations/{unlisted}/messages", headers=alice.headers,
                        json={"content": "word " * 30_000})
    assert r.status_code in (413, 422), r.text
    theirs = await new_conversation(http, bob)
    r = await http.delete("/v1/account/conversations", headers=alice.headers)
    assert r.status_code == 200 and r.json()["deleted"] >= 3
    assert (await http.get("/v1/conversations", headers=alice.headers, params={"source": "all"})).json()["items"] == []
    for cid in (first, second, unlisted):
        assert (await http.get(f"/v1/conversations/{cid}/messages", headers=alice.headers)).status_code == 404
    assert (await http.get(f"/v1/conversations/{theirs}/messages", headers=bob.headers)).status_code == 200


async def prompt_tokens(http: httpx.AsyncClient, who: Caller, cid: str) -> int:
    """The prompt tokens of the conversation's first reply, as its worker counted them, once it is saved (ended
    or cut at its length cap: the model may run on, and the prompt is counted the same)."""
    async def saved() -> int | None:
        replies = [m for m in await history(http, who, cid)
                   if m["role"] == "assistant" and m["status"] in ("complete", "length")]
        return replies[0]["usage"]["in"] if replies and replies[0]["usage"]["in"] else None
    tokens = await eventually(saved, 60)
    assert tokens, cid
    return int(tokens)


async def test_custom_instructions_are_sealed_reach_new_prompts_and_go_with_deletion(
        service: Service, http: httpx.AsyncClient, alice: Caller, db: Any, sealer: Sealer) -> None:
    secret = phrase()
    told = f"My name is {secret}. Greet me by my name, briefly."
    before = await new_conversation(http, alice)  # made before the instructions: no copy
    r = await http.patch("/v1/account", headers=alice.headers, json={"instructions": told})
    assert r.status_code == 200 and r.json()["instructions"] == told, r.text
    cid = await new_conversation(http, alice)
    for c in (before, cid):
        text_of(await send(http, alice, c, "Say hello."))
    # 1. The prompt carries them: the same message costs their tokens more.
    plain, instructed = await prompt_tokens(http, alice, before), await prompt_tokens(http, alice, cid)
    assert instructed >= plain + len(told.split()), (plain, instructed)
    # 2. Stored sealed: the account's row under a key of its own, the conversation's copy under the conversation's.
    row = (await db.execute("SELECT instructions FROM preferences WHERE user_id = ?", (alice.user_id,)))[0]
    assert is_sealed(row.instructions) and secret not in row.instructions
    assert await sealer.open_text(key_id(alice.user_id), row.instructions) == told
    copies = {c: await db.execute("SELECT role, content FROM messages WHERE conversation_id = ? AND turn = -1", (c,))
              for c in (before, cid)}
    assert copies[before] == [] and [c.role for c in copies[cid]] == ["system"]
    assert is_sealed(copies[cid][0].content) and secret not in copies[cid][0].content
    assert await sealer.open_text(cid, copies[cid][0].content) == told
    # 3. Not a message of the conversation: neither listed nor exported.
    assert [m["role"] for m in await history(http, alice, cid)] == ["user", "assistant"]
    exported = await http.get(f"/v1/conversations/{cid}/export", params={"format": "json"}, headers=alice.headers)
    assert exported.status_code == 200 and secret not in exported.text
    # 4. Deleted, the conversation's copy goes with its key and its rows.
    assert (await http.delete(f"/v1/conversations/{cid}", headers=alice.headers)).status_code == 204

    async def purged() -> bool:
        return not await rows_of(db, cid)
    assert await eventually(purged, 60), await rows_of(db, cid)
    # 5. Erased from the account: the text and the key that sealed it.
    r = await http.patch("/v1/account", headers=alice.headers, json={"instructions": None})
    assert r.status_code == 200 and r.json()["instructions"] is None
    row = (await db.execute("SELECT instructions FROM preferences WHERE user_id = ?", (alice.user_id,)))[0]
    assert row.instructions is None
    assert not await db.execute("SELECT * FROM conversation_keys WHERE conversation_id = ?", (key_id(alice.user_id),))
    after = await new_conversation(http, alice)
    assert not await db.execute("SELECT * FROM messages WHERE conversation_id = ?", (after,))


def grep(needle: str, paths: list[Path]) -> bool:
    existing = [str(p) for p in paths if p.exists()]
    if not existing:
        return False
    r = subprocess.run(["grep", "-rlaF", needle, *existing], capture_output=True, timeout=120)
    return r.returncode == 0


def grep_files(needle: str, paths: list[Path]) -> list[str]:
    r = subprocess.run(["grep", "-rlaF", needle, *map(str, paths)], capture_output=True, timeout=120, text=True)
    return r.stdout.split()


def flush(settings: Settings) -> None:
    """nodetool flush: memtables to SSTables, so the data files hold what was written."""
    from infra.local.services import java
    from infra.local.services.cassandra import MODULE_FLAGS

    lib = settings.cache_dir / "cassandra-5.0.8" / "lib"
    home = settings.state_dir / "nodetool"
    home.mkdir(parents=True, exist_ok=True)
    subprocess.run([str(java.find_java17()), *MODULE_FLAGS, f"-Dcassandra.logdir={home}", f"-Duser.home={home}",
                    "-cp", f"{lib}/*", "org.apache.cassandra.tools.NodeTool", "-h", settings.host, "-p",
                    str(settings.ports.cassandra_jmx), "flush", settings.keyspace],
                   check=True, capture_output=True, timeout=120)
    time.sleep(1)


async def test_a_conversation_made_by_the_openai_endpoint_deletes_the_same_way(http: httpx.AsyncClient,
                                                                                alice: Caller) -> None:
    r = await http.post("/v1/chat/completions", headers=alice.headers, json={
        "model": "small", "max_tokens": 8, "messages": [{"role": "user", "content": f"Hi {phrase()}"}]})
    assert r.status_code == 200, r.text
    cid, gid = r.headers["X-Conversation-Id"], r.headers["X-Generation-Id"]
    assert (await http.get(f"/v1/conversations/{cid}/messages", headers=alice.headers)).status_code == 200
    assert (await http.delete(f"/v1/conversations/{cid}", headers=alice.headers)).status_code == 204
    assert (await http.get(f"/v1/conversations/{cid}/messages", headers=alice.headers)).status_code == 404
    assert (await http.get(f"/v1/generations/{gid}/stream", headers=alice.headers)).status_code == 404
    listed = (await http.get("/v1/conversations", headers=alice.headers)).json()["items"]
    assert cid not in [c["conversation_id"] for c in listed]


# -- every store, read through its own client: a planted phrase sent by every route that stores text -------------
async def redis_dump(redis_client: Any) -> bytes:
    """Every key's name and value in Redis, whatever its type, as one blob to search (pipelined: a few round
    trips per thousand keys)."""
    reads = {"string": lambda p, k: p.get(k), "hash": lambda p, k: p.hgetall(k),
             "list": lambda p, k: p.lrange(k, 0, -1), "set": lambda p, k: p.smembers(k),
             "zset": lambda p, k: p.zrange(k, 0, -1, withscores=True), "stream": lambda p, k: p.xrange(k)}
    names = [name async for name in redis_client.scan_iter(count=1000)]
    out = []
    for i in range(0, len(names), 1000):
        chunk = names[i:i + 1000]
        pipe = redis_client.pipeline(transaction=False)
        for name in chunk:
            pipe.type(name)
        kinds = [k.decode() for k in await pipe.execute()]
        pipe = redis_client.pipeline(transaction=False)
        for name, kind in zip(chunk, kinds, strict=True):
            reads.get(kind, lambda p, k: p.exists(k))(pipe, name)
        values = await pipe.execute()
        out += [name + b"=" + repr(value).encode() for name, value in zip(chunk, values, strict=True)]
    return b"\n".join(out)


async def cassandra_rows(db: Any, keyspace: str) -> list[tuple[str, Any]]:
    """Every row of every table of the keyspace, as (table, row)."""
    tables = await db.execute("SELECT table_name FROM system_schema.tables WHERE keyspace_name = ?", (keyspace,))
    return [(t.table_name, row) for t in tables for row in await db.execute(f"SELECT * FROM {keyspace}.{t.table_name}")]


async def kafka_dump(settings: Settings) -> list[Any]:
    """Every record (key, value, headers) of every topic of this deployment, from the beginning."""
    probe = make_consumer(settings.kafka_bootstrap, group_id=None)
    await probe.start()
    try:
        names = sorted(t for t in await probe.topics() if t.startswith(settings.topic_prefix))
    finally:
        await probe.stop()
    reader = make_consumer(settings.kafka_bootstrap, *names, group_id=None)
    await reader.start()
    found: list[Any] = []
    try:
        idle = 0
        while idle < 4:
            batch = await reader.getmany(timeout_ms=500, max_records=5000)
            idle = 0 if batch else idle + 1
            found += [r for records in batch.values() for r in records]
    finally:
        await reader.stop()
    assert names and found
    return found


def kafka_blob(records: list[Any]) -> bytes:
    return b"\n".join((r.key or b"") + b"|" + (r.value or b"") + b"|" + repr(r.headers).encode() for r in records)


async def opened_row(sealer: Sealer, row: Any) -> str:
    """A row with every sealed column opened (the clear copy a store without sealing would hold)."""
    cid = getattr(row, "conversation_id", None)
    values = [await sealer.open_text(cid, v) if cid and is_sealed(v) else v for v in row]
    return repr(values)


@pytest.mark.timeout(1200)  # it reads every key, row and record of the deployment
async def test_a_phrase_sent_by_every_route_is_sealed_in_every_store(
        service: Service, http: httpx.AsyncClient, alice: Caller, db: Any, redis_client: Any,
        sealer: Sealer) -> None:
    secret, control = phrase(), phrase()
    # 1. Every route that stores text the user wrote: a title on create, a message (and its retry id), a rename,
    # the Responses API's instructions, input and metadata, an OpenAI chat request, and one with a tool (its
    # definition, a call's arguments and the tool's result).
    r = await http.post("/v1/conversations", headers=alice.headers, json={"title": f"Trip {secret}"})
    assert r.status_code == 201, r.text
    titled = r.json()["conversation_id"]
    cid = await new_conversation(http, alice)
    text_of(await send(http, alice, cid, f"Tell me about {secret} please.", client_message_id=f"id-{secret}"))
    r = await http.patch(f"/v1/conversations/{cid}", headers=alice.headers, json={"title": f"About {secret}"})
    assert r.status_code == 200, r.text
    r = await http.post("/v1/responses", headers=alice.headers, json={
        "model": "small", "max_output_tokens": 8, "input": f"Hi {secret}", "instructions": f"Be {secret}.",
        "metadata": {"tag": secret}})
    assert r.status_code == 200, r.text
    response_id, responded = r.json()["id"], r.headers["X-Conversation-Id"]
    assert r.json()["instructions"] == f"Be {secret}." and r.json()["metadata"] == {"tag": secret}
    r = await http.post("/v1/chat/completions", headers=alice.headers, json={
        "model": "small", "max_tokens": 8, "messages": [{"role": "system", "content": f"You are {secret}."},
                                                        {"role": "user", "content": f"Hello {secret}"}]})
    assert r.status_code == 200, r.text
    completed = r.headers["X-Conversation-Id"]
    # Tools: the phrase in a tool's description and parameters, in a call's arguments and in the tool's result
    tool = {"type": "function", "function": {"name": "look_up", "description": f"Finds {secret}.", "parameters": {
        "type": "object", "properties": {"what": {"type": "string", "description": f"a {secret}"}}}}}
    r = await http.post("/v1/chat/completions", headers=alice.headers, json={
        "model": "large", "max_tokens": 8, "tools": [tool], "tool_choice": "none", "messages": [
            {"role": "user", "content": "Look it up."},
            {"role": "assistant", "content": None, "tool_calls": [{"id": "call_1", "type": "function", "function": {
                "name": "look_up", "arguments": json.dumps({"what": secret})}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": f"Found {secret}."}]})
    assert r.status_code == 200, r.text
    tooled = r.headers["X-Conversation-Id"]
    r = await http.patch("/v1/account", headers=alice.headers, json={"instructions": f"Call me {secret}."})
    assert r.status_code == 200, r.text
    instructed = await new_conversation(http, alice)  # its own copy of the instructions
    ours = {titled, cid, responded, completed, tooled, instructed}
    await asyncio.sleep(3)  # persistence, the index and the title
    # Each was stored and reads back in clear to its owner: the phrase is there, only sealed.
    again = (await http.get(f"/v1/responses/{response_id}", headers=alice.headers)).json()
    assert again["instructions"] == f"Be {secret}." and again["metadata"] == {"tag": secret}
    hits = (await http.get("/v1/search", params={"q": secret}, headers=alice.headers)).json()["items"]
    assert {h["conversation_id"] for h in hits} >= {titled, cid}, hits

    # 2. Redis: every key and value, and its append-only file. The control, written in clear, is found by the
    # same reads, so the absence of the phrase means something.
    await redis_client.set(f"{keys.PREFIX}test:control", f"clear {control}", ex=60)
    dump = await redis_dump(redis_client)
    assert control.encode() in dump
    assert secret.encode() not in dump, dump[max(0, dump.find(secret.encode()) - 300):][:600]
    response_meta = await redis_client.get(keys.response(rc_generation(response_id) or ""))
    assert response_meta and secret.encode() not in response_meta
    opened = await sealer.open_values(responded, orjson.loads(response_meta)["echo"], ("instructions", "metadata"))
    assert opened["instructions"] == f"Be {secret}."  # the clear copy holds it
    aof = [service.settings.state_dir / "redis" / "data"]

    async def control_in_aof() -> bool:  # appendfsync everysec
        return grep(control, aof)
    assert await eventually(control_in_aof, 10)
    assert not grep(secret, aof), grep_files(secret, aof)
    await redis_client.delete(f"{keys.PREFIX}test:control")

    # 3. Cassandra, read through the driver: every row of every table. Opening the sealed columns of our
    # conversations' rows gives a copy that holds the phrase (title, rename, messages, Responses, OpenAI).
    rows = await cassandra_rows(db, service.settings.keyspace)
    clear_rows = [repr(list(row)) for _, row in rows]
    leaked = [(t, text) for (t, _), text in zip(rows, clear_rows, strict=True) if secret in text]
    assert not leaked, leaked[:3]
    mine = [(t, row) for t, row in rows if getattr(row, "conversation_id", None) in ours]
    opened_rows = [(t, row.conversation_id, await opened_row(sealer, row)) for t, row in mine]
    holding = {(t, c) for t, c, text in opened_rows if secret in text}
    assert {("conversations", titled), ("conversations", cid), ("messages", cid), ("messages", responded),
            ("messages", completed), ("messages", instructed)} <= holding, sorted(holding)
    [prefs] = [row for t, row in rows if t == "preferences" and row.user_id == alice.user_id]
    assert await sealer.open_text(key_id(alice.user_id), prefs.instructions) == f"Call me {secret}."

    # 4. Kafka: every record of every topic, keys and headers too; opening our events gives the phrase back.
    records = await kafka_dump(service.settings)
    blob = kafka_blob(records)
    assert cid.encode() in blob  # the ids are in clear: the reader sees these records
    assert secret.encode() not in blob, blob[max(0, blob.find(secret.encode()) - 300):][:600]
    events = []
    for r in records:
        try:
            event = decode_record(r, ALL_EVENTS)
        except EventDecodeError:
            continue
        if getattr(event, "conversation_id", None) in ours:
            events.append(await sealer.open(event))  # type: ignore[type-var]
    holding = {e.conversation_id for e in events if secret in repr(e)}  # type: ignore[attr-defined]
    assert holding >= {cid, responded, completed, tooled}, holding  # the tool's phrase went, sealed


async def test_no_sent_phrase_is_in_clear_in_any_file_or_log(service: Service, http: httpx.AsyncClient,
                                                             alice: Caller, db: Any) -> None:
    secret = phrase()
    cid = await new_conversation(http, alice)
    fs = await send(http, alice, cid, f"Tell me about {secret} the okapi.")
    reply = text_of(fs)
    await asyncio.sleep(3)  # persistence and the title
    state = service.settings.state_dir
    kafka = [p for p in (state / "kafka" / "data").glob(f"{service.settings.topic_prefix}*") if p.is_dir()]
    commitlog = [state / "cassandra" / "commitlog"]
    # The grep finds what is stored in clear: the conversation id is (a control), the phrase is not. The commit
    # log first: a flush may retire its segments.
    assert grep(cid, kafka) and grep(cid, commitlog)
    assert not grep(secret, kafka + commitlog)
    flush(service.settings)
    assert not grep(secret, [state / "cassandra" / "data" / service.settings.keyspace])
    # A distinctive piece of the model's reply: three words in a row (one word alone, "conversation" say, can be
    # part of an event's field names, which are in clear).
    ws = reply.split()
    piece = max((" ".join(ws[i:i + 3]) for i in range(len(ws) - 2)), key=len, default="")
    if len(piece) >= 12:
        assert not grep(piece, kafka), (piece, grep_files(piece, kafka))
    logs = list(service.log_dir.glob("*.log"))
    assert logs and grep(cid, logs)  # the logs carry ids (a control: the grep reads them)
    assert all(not grep(p, logs) for p in SENT), "a sent phrase is in a log"
