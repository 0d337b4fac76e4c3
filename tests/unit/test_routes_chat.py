"""The chat routes with a fake gateway (no Kafka, Redis or Cassandra): input checks and their statuses,
the client_message_id claim, a refusal before any stream, ownership of cancel and resume."""
from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from infra.config.settings import Settings
from infra.stores import keys
from infra.stores.accounts import User
from infra.stores.conversations import Message
from producers.gateway import routes_chat, submission
from producers.gateway.app import install_error_handlers
from producers.gateway.stream_slots import StreamSlots
from producers.gateway.submission import Accepted, Refused
from schemas import (
    GenerationFinished,
    GenerationQueued,
    MessageSubmitted,
    RequestRefused,
    TokensAppended,
    Usage,
    new_id,
    own_client_message_id,
)
from tests.fake_stores import FakeConversations, FakeRedis, FakeSealer, conversation

TOKENS = {"tok-ann": User("ann", "free"), "tok-bob": User("bob", "paid")}


class Relay:
    def __init__(self) -> None:
        self.buffered: dict[str, list[tuple[int, Any]]] = {}

    def subscribe(self, generation_id: str) -> asyncio.Queue[tuple[int, Any]]:
        return asyncio.Queue()

    def unsubscribe(self, generation_id: str, queue: object) -> None:
        pass

    async def attach(self, generation_id: str) -> None:
        pass

    async def replay(self, generation_id: str, after: int | None, since_ms: int) -> AsyncIterator[tuple[int, Any]]:
        for item in self.buffered.get(generation_id, []):
            if after is None or item[0] > after:
                yield item

    async def final_event(self, generation_id: str, since_ms: int) -> tuple[int, Any] | None:
        return next((i for i in self.buffered.get(generation_id, []) if isinstance(i[1], GenerationFinished)), None)

    async def check_offset(self, generation_id: str, offset: int) -> int | None:
        return offset


class ConversationOwners:
    def __init__(self, conversations: FakeConversations) -> None:
        self.conversations = conversations

    async def owner(self, conversation_id: str) -> str | None:
        conv = await self.conversations.get(conversation_id)
        return conv.user_id if conv is not None else None

    def first_message(self, conversation_id: str) -> None:
        return None  # made elsewhere: its history and its row are read


@dataclass
class Gateway:
    settings: Settings = field(default_factory=lambda: Settings().with_(max_message_chars=50))
    models: dict[str, str] = field(default_factory=lambda: {"large": "Smol", "small": "Smol"})
    conversations: FakeConversations = field(default_factory=lambda: FakeConversations(conversation("c", "ann")))
    redis: FakeRedis = field(default_factory=FakeRedis)
    relay: Relay = field(default_factory=Relay)
    owners: dict[str, tuple[str, str]] = field(default_factory=dict)
    sealer: FakeSealer = field(default_factory=FakeSealer)
    gateway_id: str = "gw-test"
    keepalive_s: float = 1.0
    streams: StreamSlots = field(default_factory=lambda: StreamSlots(8))

    @property
    def conversation_owners(self) -> ConversationOwners:
        return ConversationOwners(self.conversations)

    async def user_for_token(self, token: str) -> User | None:
        return TOKENS.get(token)

    async def owner(self, generation_id: str) -> tuple[str, str] | None:
        return self.owners.get(generation_id)

    async def reader_beat(self, generation_id: str) -> None:
        pass

    async def worker_alive(self, worker_id: str) -> bool:
        return True

    def kafka_quiet_s(self) -> float | None:
        return 0.0

    def new_generation_id(self) -> str:
        return new_id()


def reply_events(gid: str) -> list[tuple[int, Any]]:
    ids = {"generation_id": gid, "conversation_id": "c", "user_id": "ann"}
    return [(10, GenerationQueued(**ids, pool="large", model="Smol", lane="free", position=0, estimated_wait_s=0)),
            (11, TokensAppended(**ids, seq=0, text="Paris", token_ids=[1])),
            (12, GenerationFinished(**ids, plan="free", message_id=gid, status="complete", text="Paris",
                                    usage=Usage(prompt_tokens=4, completion_tokens=1), model="Smol", pool="large",
                                    worker_id="w"))]


@pytest.fixture
def submitted(monkeypatch: pytest.MonkeyPatch) -> list[MessageSubmitted]:
    """What reached ``submission.submit``; it answers with a whole reply (or a refusal for content 'refuse')."""
    seen: list[MessageSubmitted] = []

    async def submit(gw: Any, user: User, request: MessageSubmitted) -> Accepted:
        seen.append(request)
        if request.content == "refuse":
            raise Refused(RequestRefused(generation_id=request.generation_id, conversation_id="c", user_id="ann",
                                         reason="rate_limited", message="Slow down.", status=429, retry_after_s=7))
        return Accepted(request.generation_id, asyncio.Queue(), reply_events(request.generation_id))

    monkeypatch.setattr(submission, "submit", submit)
    return seen


@pytest.fixture
async def client() -> AsyncIterator[tuple[httpx.AsyncClient, Gateway]]:
    app, gw = FastAPI(), Gateway()
    app.state.gateway = gw
    install_error_handlers(app)
    app.include_router(routes_chat.router)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw") as http:
        yield http, gw


def post(http: httpx.AsyncClient, body: dict[str, Any], token: str = "tok-ann", conv: str = "c") -> Any:
    return http.post(f"/v1/conversations/{conv}/messages", json=body, headers={"Authorization": f"Bearer {token}"})


def events(text: str) -> list[str]:
    return [line.split(": ", 1)[1] for line in text.splitlines() if line.startswith("event: ")]


@pytest.mark.parametrize(("body", "status", "code"), [
    ({"content": "   "}, 422, "empty_content"),
    ({"content": "x" * 51}, 413, "too_large"),
    ({"content": "hi", "model": "huge"}, 422, "unknown_model"),
    ({"text": "hi"}, 422, "invalid_request"),
])
async def test_bad_input_is_refused_with_its_status_and_costs_nothing(
        client: tuple[httpx.AsyncClient, Gateway], submitted: list[Any], body: dict[str, Any], status: int,
        code: str) -> None:
    http, _ = client
    response = await post(http, body)
    assert response.status_code == status and response.json()["error"]["code"] == code
    assert submitted == []


async def test_someone_elses_conversation_and_a_bad_token_look_missing_or_unauthorised(
        client: tuple[httpx.AsyncClient, Gateway], submitted: list[Any]) -> None:
    http, _ = client
    assert (await post(http, {"content": "hi"}, token="tok-bob")).status_code == 404
    assert (await post(http, {"content": "hi"}, token="nope")).status_code == 401
    assert (await post(http, {"content": "hi"}, conv="missing")).status_code == 404
    assert submitted == []


async def test_a_message_streams_its_reply_and_a_retry_attaches_to_the_same_generation(
        client: tuple[httpx.AsyncClient, Gateway], submitted: list[MessageSubmitted]) -> None:
    http, gw = client
    first = await post(http, {"content": "Capital of France?", "client_message_id": "m-1"})
    assert first.status_code == 200 and events(first.text) == ["message_start", "delta", "message_end"]
    [request] = submitted
    gid = first.headers["X-Generation-Id"]
    cmid = f"c-{gw.sealer.digest('ann', 'c', 'm-1')}"  # the client's id is kept as a keyed hash, never in clear
    assert request.generation_id == gid and request.pool == "large" and request.client_message_id == cmid
    claim = (await gw.redis.get(keys.client_message("c", cmid))).split()
    assert claim == [gid.encode(), gw.sealer.digest("ann", "Capital of France?")[:16].encode()]
    gw.relay.buffered[gid] = reply_events(gid)
    again = await post(http, {"content": "Capital of France?", "client_message_id": "m-1"})
    assert again.headers["X-Generation-Id"] == gid and events(again.text)[-1] == "message_end"
    assert len(submitted) == 1  # the retry produced nothing new


async def test_a_message_without_a_client_id_claims_nothing(
        client: tuple[httpx.AsyncClient, Gateway], submitted: list[MessageSubmitted]) -> None:
    """The page sends no client_message_id: no retry can name the message, so its id is made from the generation's
    (the prompt build then asks Cassandra for no claim) and nothing is claimed in Redis."""
    http, gw = client
    before = set(gw.redis.values)
    first = await post(http, {"content": "Capital of France?"})
    second = await post(http, {"content": "Capital of France?"})
    assert first.status_code == second.status_code == 200
    assert [r.client_message_id for r in submitted] == [own_client_message_id(first.headers["X-Generation-Id"]),
                                                        own_client_message_id(second.headers["X-Generation-Id"])]
    assert first.headers["X-Generation-Id"] != second.headers["X-Generation-Id"]  # two messages, not a retry
    made = set(gw.redis.values) - before
    assert not [k for k in made if k.startswith(keys.client_message("c", ""))], made


async def test_a_refusal_is_a_plain_http_error_and_frees_the_retry_key(
        client: tuple[httpx.AsyncClient, Gateway], submitted: list[Any]) -> None:
    http, gw = client
    response = await post(http, {"content": "refuse", "client_message_id": "m-2"})
    assert response.status_code == 429 and response.headers["Retry-After"] == "7"
    assert response.json()["error"] == {"code": "rate_limited", "message": "Slow down.", "retry_after_s": 7}
    assert await gw.redis.get(keys.client_message("c", f"c-{gw.sealer.digest('ann', 'c', 'm-2')}")) is None


async def test_only_the_owner_may_cancel_or_resume(client: tuple[httpx.AsyncClient, Gateway],
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    http, gw = client
    cancelled: list[str] = []

    async def cancel(gw: Any, generation_id: str, conversation_id: str, user_id: str) -> None:
        cancelled.append(generation_id)

    monkeypatch.setattr(submission, "cancel", cancel)
    gw.owners["g1"] = ("ann", "c")
    bob, ann = {"Authorization": "Bearer tok-bob"}, {"Authorization": "Bearer tok-ann"}
    assert (await http.post("/v1/generations/g1/cancel", headers=bob)).status_code == 404
    assert (await http.post("/v1/generations/g1/cancel", headers=ann)).status_code == 202
    assert cancelled == ["g1"]
    assert (await http.get("/v1/generations/g1/stream", headers=bob)).status_code == 404
    bad = await http.get("/v1/generations/g1/stream", headers={**ann, "Last-Event-ID": "x"})
    assert bad.status_code == 422 and bad.json()["error"]["code"] == "bad_last_event_id"


async def test_regenerating_answers_the_user_message_again(client: tuple[httpx.AsyncClient, Gateway],
                                                           submitted: list[MessageSubmitted]) -> None:
    http, gw = client
    await gw.conversations.save_message(Message("c", 0, "um", "user", "Capital of France?"))
    await gw.conversations.save_message(Message("c", 0, "r1", "assistant", "Paris", parent_id="um"))
    headers = {"Authorization": "Bearer tok-ann"}
    response = await http.post("/v1/conversations/c/messages/r1/regenerate", json={}, headers=headers)
    assert response.status_code == 200
    [request] = submitted
    assert request.regenerate and request.parent_id == "um" and request.content == "Capital of France?"
    assert (await http.post("/v1/conversations/c/messages/zz/regenerate", headers=headers)).status_code == 404
