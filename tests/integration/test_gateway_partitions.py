"""Two real gateways over one token topic (uvicorn, Kafka, Redis, Cassandra), each tailing its own half of
``chat.tokens``: a reply started on one is resumed with ``Last-Event-ID`` on the other and every token arrives
exactly once, while the other gateway reads no record of the first one's partitions except during the resume.
The test plays the stages: it queues the request and appends the tokens itself."""
from __future__ import annotations

import asyncio
import dataclasses
import json
import subprocess
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from aiokafka import AIOKafkaProducer, TopicPartition

from infra.config.settings import Settings
from infra.local import balancer
from infra.stores.accounts import Accounts
from infra.stores.session import AsyncSession
from producers.gateway.cli import build
from producers.gateway.state import Gateway
from schemas import (
    GenerationFinished,
    GenerationQueued,
    GenerationStarted,
    MessageSubmitted,
    TokensAppended,
    Usage,
    decode_record,
)
from tests.integration.gateway_server import free_port, serve_app
from tests.tools import missing
from topics import Topics
from topics.clients import make_consumer, make_producer, send, topic_partitions
from topics.partitioning import partition_for

TOKENS = 12
FIRST = 5  # tokens appended before the client leaves gateway A; the rest only once it follows on B


@dataclass
class Pair:
    urls: tuple[str, str]
    gateways: tuple[Gateway, Gateway]
    settings: Settings


@pytest.fixture
def pair(settings: Settings, tmp_path: Path) -> Iterator[Pair]:
    with ExitStack() as stack:
        urls, gateways = [], []
        for index in range(2):
            app = build(settings.with_(state_dir=tmp_path, gateway_index=index, gateway_count=2))
            urls.append(stack.enter_context(serve_app(app)))
            gateways.append(app.state.gateway)
            app.state.gateway.relay.borrowed.linger_s = 0.5  # a borrowed tail closes soon after its last stream
        yield Pair((urls[0], urls[1]), (gateways[0], gateways[1]), settings)


@pytest.fixture
async def producer(settings: Settings) -> AsyncIterator[AIOKafkaProducer]:
    p = make_producer(settings.kafka_bootstrap)
    await p.start()
    yield p
    await p.stop()


class Stages:
    """Queues the next request, starts it, appends ``FIRST`` tokens; the rest and the end after ``go_on``."""

    def __init__(self, settings: Settings, producer: AIOKafkaProducer) -> None:
        self.settings, self.producer, self.topics = settings, producer, Topics(settings.topic_prefix)
        self.go_on, self.first_sent, self.generation_id = asyncio.Event(), asyncio.Event(), ""

    async def run(self) -> None:
        consumer = make_consumer(self.settings.kafka_bootstrap, group_id=None)
        await consumer.start()
        try:
            tps = [TopicPartition(self.topics.requests, p)
                   for p in await topic_partitions(consumer, self.topics.requests)]
            consumer.assign(tps)
            await consumer.seek_to_beginning(*tps)
            request = await self._next_request(consumer)
        finally:
            await consumer.stop()
        gid = self.generation_id = request.generation_id
        ids: dict[str, Any] = {"generation_id": gid, "conversation_id": request.conversation_id,
                               "user_id": request.user_id}
        await self._send(GenerationQueued(**ids, pool="large", model="m", lane="free", position=0,
                                          estimated_wait_s=0, message_id=request.message_id))
        await self._send(GenerationStarted(**ids, message_id=request.message_id, model="m", pool="large",
                                           worker_id="w-test", first_token_at=0.0, prompt_tokens=3))
        for seq in range(FIRST):
            await self._send(TokensAppended(**ids, seq=seq, text=f" t{seq}", token_ids=[seq]))
        self.first_sent.set()
        await self.go_on.wait()
        for seq in range(FIRST, TOKENS):
            await self._send(TokensAppended(**ids, seq=seq, text=f" t{seq}", token_ids=[seq]))
        await self._send(GenerationFinished(**ids, plan="free", message_id=request.message_id, status="complete",
                                            text="".join(f" t{s}" for s in range(TOKENS)), model="m", pool="large",
                                            usage=Usage(prompt_tokens=3, completion_tokens=TOKENS), worker_id="w"))

    async def _next_request(self, consumer: Any) -> MessageSubmitted:
        while True:
            for records in (await consumer.getmany(timeout_ms=500)).values():
                for record in records:
                    event = decode_record(record)
                    if isinstance(event, MessageSubmitted):
                        return event

    async def _send(self, event: Any) -> None:
        await send(self.producer, self.topics.tokens, event, key=event.generation_id)


def events(chunk: str) -> list[tuple[str, int | None, dict[str, Any]]]:
    found = []
    for block in chunk.strip().split("\n\n"):
        fields = dict(line.split(": ", 1) for line in block.split("\n") if ": " in line and not line.startswith(":"))
        if "event" in fields:
            found.append((fields["event"], int(fields["id"]) if "id" in fields else None, json.loads(fields["data"])))
    return found


class Frames:
    """One response's SSE events, read in parts: ``until`` returns the events read up to ``stop``."""

    def __init__(self, response: httpx.Response) -> None:
        self.chunks, self.buffer = response.aiter_text(), ""

    async def until(self, stop: Any) -> list[tuple[str, int | None, dict[str, Any]]]:
        seen: list[tuple[str, int | None, dict[str, Any]]] = []
        while not (seen and stop(seen)):
            while "\n\n" not in self.buffer:
                self.buffer += await anext(self.chunks)
            block, self.buffer = self.buffer.split("\n\n", 1)
            seen.extend(events(block + "\n\n"))
        return seen


def others_partitions(gateway: Gateway, partitions: int) -> list[int]:
    return [p for p in range(partitions) if p not in gateway.relay.mine]


async def test_a_reply_started_on_one_gateway_resumes_on_the_other_with_every_token_once(
        pair: Pair, producer: AIOKafkaProducer, db: AsyncSession) -> None:
    a, b = pair.gateways
    partitions = a.relay.partitions
    assert a.relay.mine | b.relay.mine == set(range(partitions)) and not a.relay.mine & b.relay.mine
    user, token = await Accounts(db).create_user("free")
    headers = {"Authorization": f"Bearer {token}"}
    stages = Stages(pair.settings, producer)
    playing = asyncio.create_task(stages.run())
    async with httpx.AsyncClient(base_url=pair.urls[0], timeout=30) as on_a:
        conv = (await on_a.post("/v1/conversations", headers=headers)).json()["conversation_id"]
        async with on_a.stream("POST", f"/v1/conversations/{conv}/messages", json={"content": "hi"},
                               headers=headers) as r:
            assert r.status_code == 200, (await r.aread()).decode()
            first = await asyncio.wait_for(Frames(r).until(lambda s: sum(e[0] == "delta" for e in s) == 2), 30)
    gid = stages.generation_id
    assert partition_for(gid, partitions) in a.relay.mine  # A minted the id onto its own partitions
    await asyncio.wait_for(stages.first_sent.wait(), 10)
    for _ in range(100):  # until A's tail has fetched them (it reads its partitions whether or not anyone listens)
        if sum(a.relay.read[p] for p in a.relay.mine) >= 2 + FIRST:
            break
        await asyncio.sleep(0.05)
    # Gateway B has followed nothing of A's, though A's partition now holds the queued, started and 5 tokens.
    assert sum(a.relay.read[p] for p in a.relay.mine) >= 2 + FIRST
    assert all(b.relay.read[p] == 0 for p in a.relay.mine)
    last_id = first[-1][1]
    async with httpx.AsyncClient(base_url=pair.urls[1], timeout=30) as on_b:
        async with on_b.stream("GET", f"/v1/generations/{gid}/stream",
                               headers=headers | {"Last-Event-ID": str(last_id)}) as r:
            assert r.status_code == 200, (await r.aread()).decode()
            frames = Frames(r)
            replayed = await asyncio.wait_for(frames.until(lambda s: sum(e[0] == "delta" for e in s) == FIRST - 2), 30)
            assert partition_for(gid, partitions) in b.relay.borrowed.tails  # one borrowed tail while it streams
            stages.go_on.set()  # the rest is appended while B follows: it arrives through B's borrowed tail
            rest = await asyncio.wait_for(frames.until(lambda s: s[-1][0] == "message_end"), 30)
    await asyncio.wait_for(playing, 10)
    deltas = [e for e in first + replayed + rest if e[0] == "delta"]
    assert [d[2]["text"] for d in deltas] == [f" t{s}" for s in range(TOKENS)]  # each once, in order
    ids = [d[1] or 0 for d in deltas]
    assert ids == sorted(set(ids)) and all(d[1] is not None for d in deltas)
    assert rest[-1][0] == "message_end" and rest[-1][2]["usage"]["out"] == TOKENS
    # The stream on B ended: its borrowed tail closes, and A's partitions are read by A alone again.
    for _ in range(50):
        if not b.relay.borrowed.tails:
            break
        await asyncio.sleep(0.1)
    assert b.relay.borrowed.tails == {}
    read_by_b = {p: b.relay.read[p] for p in a.relay.mine}
    assert sum(read_by_b.values()) >= TOKENS - FIRST  # the live part came through B's own reader of it
    more = {"generation_id": gid, "conversation_id": conv, "user_id": user.user_id}
    for seq in range(20):  # another burst on A's partition, nobody on B following it
        await send(producer, Topics(pair.settings.topic_prefix).tokens,
                   TokensAppended(**more, seq=100 + seq, text="x", token_ids=[1]), key=gid)
    await asyncio.sleep(1.0)
    assert {p: b.relay.read[p] for p in a.relay.mine} == read_by_b
    assert others_partitions(b, partitions) == sorted(a.relay.mine)


@pytest.fixture
def haproxy(pair: Pair, tmp_path: Path) -> Iterator[str]:
    """Debian's HAProxy in front of the pair, with the config `parley up --gateways 2` writes."""
    binary = balancer.find_binary()
    if binary is None:
        missing("haproxy", "apt-get install --no-install-recommends haproxy")
    settings = pair.settings.with_(state_dir=tmp_path, ports=dataclasses.replace(pair.settings.ports,
                                                                                  gateway=free_port()))
    path = tmp_path / "haproxy.cfg"
    path.write_text(balancer.config(settings, [int(url.rsplit(":", 1)[1]) for url in pair.urls]))
    proc = subprocess.Popen(balancer.command(binary, path), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    url = f"http://{settings.host}:{settings.ports.gateway}"
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                if httpx.get(f"{url}/healthz", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.2)
        else:
            raise RuntimeError(f"haproxy did not answer: {proc.stderr.read().decode() if proc.stderr else ''}")
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=10)


async def test_through_haproxy_a_stream_comes_as_it_is_written_and_resumes_on_either_gateway(
        pair: Pair, haproxy: str, producer: AIOKafkaProducer, db: AsyncSession) -> None:
    _, token = await Accounts(db).create_user("free")
    headers = {"Authorization": f"Bearer {token}"}
    stages = Stages(pair.settings, producer)
    playing = asyncio.create_task(stages.run())
    async with httpx.AsyncClient(base_url=haproxy, timeout=30) as http:
        conv = (await http.post("/v1/conversations", headers=headers)).json()["conversation_id"]
        async with http.stream("POST", f"/v1/conversations/{conv}/messages", json={"content": "hi"},
                               headers=headers) as r:
            assert r.status_code == 200, (await r.aread()).decode()
            # Unbuffered: the first tokens arrive while the reply is still being written (the rest waits on us).
            first = await asyncio.wait_for(Frames(r).until(lambda s: sum(e[0] == "delta" for e in s) == FIRST),
                                           30)
        assert not stages.go_on.is_set()
        async with http.stream("GET", f"/v1/generations/{stages.generation_id}/stream",
                               headers=headers | {"Last-Event-ID": str(first[-1][1])}) as r:
            assert r.status_code == 200, (await r.aread()).decode()
            frames = Frames(r)
            stages.go_on.set()
            rest = await asyncio.wait_for(frames.until(lambda s: s[-1][0] == "message_end"), 30)
    await asyncio.wait_for(playing, 10)
    texts = [e[2]["text"] for e in first + rest if e[0] == "delta"]
    assert texts == [f" t{s}" for s in range(TOKENS)]
