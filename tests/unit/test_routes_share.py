"""Share links and export over HTTP with in-memory stores: a share is a sealed snapshot that anyone can read,
names nobody, and ends with a revoke or its conversation's deletion; export is the owner's branch as a file."""
from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from types import SimpleNamespace
from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from infra.stores.accounts import User
from infra.stores.conversations import Conversation, Message
from infra.stores.shares import Shares
from producers.gateway import routes_export, routes_share
from producers.gateway.app import install_error_handlers
from tests.fake_stores import conversation

TOKENS = {"tok-ann": User("ann", "free"), "tok-bob": User("bob", "free")}
AT = datetime(2026, 12, 1, tzinfo=UTC)


class Db:
    """The shares tables, answering exactly the statements ``infra/stores/shares.py`` sends."""

    def __init__(self) -> None:
        self.shares: dict[str, dict[str, Any]] = {}
        self.by_user: dict[tuple[str, str], dict[str, Any]] = {}

    async def execute(self, cql: str, params: tuple[Any, ...]) -> list[Any]:
        if cql.startswith("INSERT INTO shares ("):
            self.shares[params[0]] = dict(zip(("share_id", "conversation_id", "user_id", "snapshot",
                                               "message_count", "created_at"), params, strict=True))
        elif cql.startswith("INSERT INTO shares_by_user"):
            self.by_user[params[0], params[1]] = dict(zip(("user_id", "share_id", "conversation_id", "message_count",
                                                           "created_at"), params, strict=True))
        elif cql.startswith("DELETE FROM shares WHERE"):
            self.shares.pop(params[0], None)
        elif cql.startswith("DELETE FROM shares_by_user"):
            self.by_user.pop((params[0], params[1]), None)
        elif "FROM shares WHERE share_id" in cql:
            return [SimpleNamespace(**self.shares[params[0]])] if params[0] in self.shares else []
        elif "FROM shares_by_user WHERE user_id" in cql:
            return [SimpleNamespace(**r) for (user, _), r in self.by_user.items() if user == params[0]]
        else:
            raise AssertionError(cql)
        return []


@dataclass
class Sealer:
    gone: set[str] = field(default_factory=set)  # conversations whose data key was destroyed

    async def seal_text(self, conversation_id: str, text: str) -> str:
        return f"sealed:{conversation_id}:{text[::-1]}"

    async def open_text(self, conversation_id: str, value: str) -> str | None:
        prefix = f"sealed:{conversation_id}:"
        assert value.startswith(prefix)
        return None if conversation_id in self.gone else value[len(prefix):][::-1]


class Convs:
    def __init__(self, db: Db) -> None:
        self.db = db
        made = (conversation("c", "ann", "Fruit"), conversation("d", "ann"), conversation("e", "bob"))
        self.conversations = {c.conversation_id: c for c in made}
        self.rows: list[Message] = []

    async def get(self, conversation_id: str) -> Conversation | None:
        return self.conversations.get(conversation_id)

    async def save_message(self, message: Message) -> None:
        self.rows.append(message)

    async def messages(self, conversation_id: str, cursor: str | None, limit: int) -> tuple[list[Message], None]:
        return [m for m in self.rows if m.conversation_id == conversation_id], None

    async def ids_of_user(self, user_id: str) -> list[str]:
        return sorted(c for c, conv in self.conversations.items() if conv.user_id == user_id)


@dataclass
class Gateway:
    db: Db = field(default_factory=Db)
    sealer: Sealer = field(default_factory=Sealer)
    conversations: Convs = field(init=False)

    def __post_init__(self) -> None:
        self.conversations = Convs(self.db)

    @property
    def finished(self) -> Any:
        return self

    async def current(self, messages: list[Message]) -> list[Message]:
        return messages

    async def user_for_token(self, token: str) -> User | None:
        return TOKENS.get(token)


async def say(gw: Gateway, n: int, role: str, parent: str | None, text: str, status: str = "complete") -> None:
    await gw.conversations.save_message(Message("c", n // 2, f"m{n}", role, text, status=status, parent_id=parent,
                                                model="SmolLM2" if role == "assistant" else None, created_at=AT))


@pytest.fixture
async def client() -> AsyncIterator[tuple[httpx.AsyncClient, Gateway]]:
    app, gw = FastAPI(), Gateway()
    app.state.gateway = gw
    install_error_handlers(app)
    app.include_router(routes_export.router)
    app.include_router(routes_share.router)
    await say(gw, 0, "user", None, "Name a <b>fruit</b>.")
    await say(gw, 1, "assistant", "m0", "A **pear**.")
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw") as http:
        yield http, gw


ANN, BOB = {"Authorization": "Bearer tok-ann"}, {"Authorization": "Bearer tok-bob"}


async def test_a_share_is_a_sealed_snapshot_that_names_nobody(client: Any) -> None:
    http, gw = client
    r = await http.post("/v1/conversations/c/share", headers=ANN)
    assert r.status_code == 201, r.text
    share = r.json()
    assert share["message_count"] == 2 and share["path"] == f"/s/{share['share_id']}"
    stored = gw.db.shares[share["share_id"]]
    assert stored["snapshot"].startswith("sealed:c:") and "pear" not in stored["snapshot"]
    await say(gw, 2, "user", "m1", "And a tree?")  # after the share: not in it
    await say(gw, 3, "assistant", "m2", "An oak.")

    public = await http.get(f"/v1/shares/{share['share_id']}")  # no token
    assert public.status_code == 200 and "noindex" in public.headers["x-robots-tag"]
    assert public.json()["title"] == "Fruit"
    assert [(m["role"], m["content"]) for m in public.json()["messages"]] == [
        ("user", "Name a <b>fruit</b>."), ("assistant", "A **pear**.")]
    shown = public.text.replace(share["share_id"], "")  # a random id may spell "m1" by chance
    for name in ("ann", '"c"', "m0", "m1", "conversation_id", "message_id"):
        assert name not in shown

    listed = (await http.get("/v1/shares", headers=ANN)).json()["items"]
    assert [s["share_id"] for s in listed] == [share["share_id"]]
    assert (await http.get("/v1/shares", headers=BOB)).json()["items"] == []


async def test_only_the_owner_shares_and_revokes_and_a_revoked_or_erased_share_is_gone(client: Any) -> None:
    http, gw = client
    assert (await http.post("/v1/conversations/c/share", headers=BOB)).status_code == 404
    assert (await http.post("/v1/conversations/c/share")).status_code == 401
    share_id = (await http.post("/v1/conversations/c/share", headers=ANN)).json()["share_id"]
    assert (await http.delete(f"/v1/shares/{share_id}", headers=BOB)).status_code == 404
    assert (await http.delete(f"/v1/shares/{share_id}", headers=ANN)).status_code == 204
    assert (await http.get(f"/v1/shares/{share_id}")).status_code == 404
    assert gw.db.shares == {} and gw.db.by_user == {}

    again = (await http.post("/v1/conversations/c/share", headers=ANN)).json()["share_id"]
    gw.sealer.gone.add("c")  # the conversation was deleted: its data key destroyed
    assert (await http.get(f"/v1/shares/{again}")).status_code == 404
    assert await Shares(gw.db).forget_conversation("ann", "c") == 1  # and the delete removes the rows
    assert gw.db.shares == {} and await Shares(gw.db).forget_conversation("ann", "c") == 0


@pytest.mark.parametrize("share_id", ["short", "x" * 65, "bad%20id!!!!!!!!!!!"])
async def test_a_malformed_share_id_is_404_without_a_store_read(client: Any, share_id: str) -> None:
    http, gw = client
    gw.db.execute = None  # any store call would fail
    assert (await http.get(f"/v1/shares/{share_id}")).status_code == 404


async def test_a_reply_still_being_written_or_without_text_is_not_shared(client: Any) -> None:
    http, gw = client
    await say(gw, 2, "user", "m1", "More?")
    await say(gw, 3, "assistant", "m2", "", status="generating")
    share = (await http.post("/v1/conversations/c/share", headers=ANN, json={"message_id": "m3"})).json()
    assert share["message_count"] == 3
    await say(gw, 5, "assistant", "m2", "", status="failed")  # ended with no text: nothing to show either
    share = (await http.post("/v1/conversations/c/share", headers=ANN, json={"message_id": "m5"})).json()
    assert share["message_count"] == 3
    assert (await http.post("/v1/conversations/d/share", headers=ANN)).json()["error"]["code"] == "nothing_to_share"
    assert (await http.post("/v1/conversations/c/share", headers=ANN, json={"message_id": "nope"})).status_code == 404


async def test_export_is_the_owners_branch_as_a_file(client: Any) -> None:
    http, gw = client
    await say(gw, 2, "user", "m1", "And a tree?")
    r = await http.get("/v1/conversations/c/export", headers=ANN)
    assert r.status_code == 200
    assert r.headers["content-disposition"] == 'attachment; filename="parley-fruit.json"'
    assert [m["message_id"] for m in r.json()["messages"]] == ["m0", "m1", "m2"]
    md = await http.get("/v1/conversations/c/export", params={"format": "markdown", "message_id": "m1"}, headers=ANN)
    assert md.headers["content-type"].startswith("text/markdown")
    assert md.text.startswith("# Fruit\n") and "A **pear**." in md.text and "tree" not in md.text
    assert (await http.get("/v1/conversations/c/export", headers=BOB)).status_code == 404
    assert (await http.get("/v1/conversations/c/export?format=pdf", headers=ANN)).status_code == 422


async def test_the_account_export_is_every_conversation_of_the_caller_in_one_json(client: Any) -> None:
    http, gw = client
    r = await http.get("/v1/conversations/export", headers=ANN)
    assert r.status_code == 200 and r.headers["content-disposition"].startswith("attachment")
    doc = json.loads(r.content)
    assert [c["conversation_id"] for c in doc["conversations"]] == ["c", "d"]
    assert [m["content"] for m in doc["conversations"][0]["messages"]] == ["Name a <b>fruit</b>.", "A **pear**."]
    assert routes_export._running == set()  # the stream ended: another export may start


async def test_the_account_export_as_markdown_is_each_conversations_branch_to_read(client: Any) -> None:
    http, gw = client
    await say(gw, 2, "user", "m1", "And a tree?")  # a later turn: on the branch shown
    r = await http.get("/v1/conversations/export", params={"format": "markdown"}, headers=ANN)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/markdown")
    assert r.headers["content-disposition"] == 'attachment; filename="parley-conversations.md"'
    first, second = r.text.split("\n---\n\n")  # one per conversation of the caller, none of another's
    assert first.startswith("# Fruit\n") and "A **pear**." in first and "And a tree?" in first
    assert second.startswith("# Untitled conversation\n")
    bobs = await http.get("/v1/conversations/export", params={"format": "markdown"}, headers=BOB)
    assert "Fruit" not in bobs.text and "pear" not in bobs.text
    assert (await http.get("/v1/conversations/export?format=pdf", headers=ANN)).status_code == 422
    assert routes_export._running == set()
