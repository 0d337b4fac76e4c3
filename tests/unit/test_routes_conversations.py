"""Renaming and deleting conversations over HTTP with fake stores: validation, ownership, idempotence."""
from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from infra.stores import keys
from infra.stores.accounts import User
from infra.stores.conversations import Conversation, Message
from infra.stores.preferences import INSTRUCTIONS_ID, Prefs, instructions_in
from producers.gateway import deletion, routes_conversations
from producers.gateway.app import install_error_handlers
from producers.gateway.transcript import message_json as exported
from tests.fake_stores import FakeConversations, FakeRedis, conversation

TOKENS = {"tok-ann": User("ann", "free"), "tok-bob": User("bob", "free"), "tok-pat": User("pat", "private")}
NO_RETENTION = {"private"}


class Convs(FakeConversations):
    """Renames, hiding, and the raw rows a repeated delete consults."""

    def __init__(self, *cs: Conversation) -> None:
        super().__init__(*cs)
        self.owners = {c.conversation_id: c.user_id for c in cs}
        self.db = self

    async def create(self, user_id: str, model: str | None, title: str | None, listed: bool) -> Conversation:
        made = dataclasses.replace(conversation(f"new{len(self.conversations)}", user_id), title=title)
        self.conversations[made.conversation_id] = made
        return made

    async def rename(self, conv: Conversation, title: str) -> None:
        self.conversations[conv.conversation_id] = dataclasses.replace(conv, title=title)

    async def execute(self, cql: str, params: tuple[Any, ...]) -> list[Any]:
        owner = self.owners.get(params[0])
        return [type("Row", (), {"user_id": owner})()] if owner else []

    async def ids_of_user(self, user_id: str) -> list[str]:
        return sorted(cid for cid, owner in self.owners.items() if owner == user_id)


@dataclass
class Saved:
    """The preferences store's read: every user has custom instructions saved."""

    async def get(self, user_id: str) -> Prefs:
        return Prefs(f"Call me {user_id}.")


@dataclass
class Keys:
    heard: int = 0


@dataclass
class Owners:
    """The gateway's owner memory: which conversations it was told it made, and for whom."""

    keys: Keys = field(default_factory=Keys)
    made_here: list[tuple[str, str, int]] = field(default_factory=list)
    unlisted: list[str] = field(default_factory=list)
    told: dict[str, str | None] = field(default_factory=dict)

    def made(self, conversation_id: str, user_id: str, heard: int) -> None:
        self.made_here.append((conversation_id, user_id, heard))

    def made_unlisted(self, conversation_id: str, instructions: str | None) -> None:
        self.unlisted.append(conversation_id)
        self.told[conversation_id] = instructions


@dataclass
class Gateway:
    conversations: Convs = field(default_factory=lambda: Convs(conversation("c", "ann"), conversation("d", "ann"),
                                                               conversation("e", "bob"), conversation("p", "pat")))
    preferences: Saved = field(default_factory=Saved)
    conversation_owners: Owners = field(default_factory=Owners)
    models: dict[str, str] = field(default_factory=lambda: {"large": "Smol", "small": "Smol"})
    redis: FakeRedis = field(default_factory=FakeRedis)

    async def user_for_token(self, token: str) -> User | None:
        return TOKENS.get(token)

    def keeps_nothing(self, user: User) -> bool:
        return user.plan in NO_RETENTION

    @property
    def search(self) -> Any:
        return self

    async def index(self, *args: Any) -> None:
        pass


@pytest.fixture
async def client(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[tuple[httpx.AsyncClient, Gateway, list[str]]]:
    deleted: list[str] = []

    async def delete(gw: Gateway, conv: Conversation, reason: str = "user") -> None:
        deleted.append(f"{conv.conversation_id}:{reason}")
        gw.conversations.conversations.pop(conv.conversation_id)  # hidden: get answers None from now on

    monkeypatch.setattr(deletion, "delete", delete)
    app, gw = FastAPI(), Gateway()
    app.state.gateway = gw
    install_error_handlers(app)
    app.include_router(routes_conversations.router)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw") as http:
        yield http, gw, deleted


def auth(who: str) -> dict[str, str]:
    return {"Authorization": f"Bearer tok-{who}"}


@pytest.mark.parametrize(("title", "code"), [("   ", "empty_title"), ("x" * 201, "title_too_long"),
                                              ("a\u0007b", "bad_title")])
async def test_a_bad_title_is_refused_with_its_reason(client: Any, title: str, code: str) -> None:
    http, gw, _ = client
    r = await http.patch("/v1/conversations/c", json={"title": title}, headers=auth("ann"))
    assert r.status_code == 422 and r.json()["error"]["code"] == code
    assert gw.conversations.conversations["c"].title is None


@pytest.mark.parametrize(("title", "code"), [("   ", "empty_title"), ("x" * 201, "title_too_long"),
                                              ("a\u0000b", "bad_title"), ("line\n\u0000", "bad_title")])
async def test_a_new_conversations_title_follows_the_rename_rule(client: Any, title: str, code: str) -> None:
    http, gw, _ = client
    before = set(gw.conversations.conversations)
    r = await http.post("/v1/conversations", json={"title": title}, headers=auth("ann"))
    assert r.status_code == 422 and r.json()["error"]["code"] == code
    assert set(gw.conversations.conversations) == before  # nothing made


async def test_a_rename_keeps_one_line_and_only_the_owner_may(client: Any) -> None:
    http, gw, _ = client
    r = await http.patch("/v1/conversations/c", json={"title": "  Trip\n plans "}, headers=auth("ann"))
    assert r.status_code == 200 and r.json()["title"] == "Trip plans"
    assert (await http.patch("/v1/conversations/c", json={"title": "mine"}, headers=auth("bob"))).status_code == 404
    assert gw.conversations.conversations["c"].title == "Trip plans"
    mark = gw.redis.values[keys.conversation_changed("c")]  # persistence reads the renamed row again
    await http.patch("/v1/conversations/c", json={"title": "Trip plans, day two"}, headers=auth("ann"))
    assert gw.redis.values[keys.conversation_changed("c")] != mark
    assert keys.conversation_changed("d") not in gw.redis.values
    r = await http.patch("/v1/conversations/p", json={"title": "x"}, headers=auth("pat"))
    assert r.status_code == 422 and r.json()["error"]["code"] == "no_retention"


async def test_delete_is_owner_only_and_idempotent(client: Any) -> None:
    http, _, deleted = client
    assert (await http.delete("/v1/conversations/c", headers=auth("bob"))).status_code == 404
    assert deleted == []
    assert (await http.delete("/v1/conversations/c", headers=auth("ann"))).status_code == 204
    assert (await http.delete("/v1/conversations/c", headers=auth("ann"))).status_code == 204  # again: no-op
    assert (await http.delete("/v1/conversations/c", headers=auth("bob"))).status_code == 404  # not theirs
    assert (await http.delete("/v1/conversations/nope", headers=auth("ann"))).status_code == 404
    assert deleted == ["c:user"]


async def test_delete_all_takes_only_the_callers_conversations(client: Any) -> None:
    http, gw, deleted = client
    r = await http.delete("/v1/account/conversations", headers=auth("ann"))
    assert r.status_code == 200 and r.json() == {"deleted": 2}
    assert sorted(deleted) == ["c:account", "d:account"] and "e" in gw.conversations.conversations


async def test_a_new_conversations_title_is_folded_to_one_line(client: Any) -> None:
    http, gw, _ = client
    r = await http.post("/v1/conversations", json={"title": "  Trip\n plans "}, headers=auth("ann"))
    assert r.status_code == 201
    assert gw.conversations.conversations[r.json()["conversation_id"]].title == "Trip plans"
    # The gateway remembers it made it for ann, as of the destructions heard before it was made.
    assert gw.conversation_owners.made_here == [(r.json()["conversation_id"], "ann", 0)]
    assert gw.conversation_owners.unlisted == []  # listed at once, as it has a title


async def test_an_untitled_conversation_tells_its_first_message_here_it_is_unlisted(client: Any) -> None:
    http, gw, _ = client
    made = (await http.post("/v1/conversations", json={}, headers=auth("ann"))).json()["conversation_id"]
    named = (await http.post("/v1/conversations", json={"model": "small"}, headers=auth("ann"))).json()
    private = (await http.post("/v1/conversations", json={}, headers=auth("pat"))).json()["conversation_id"]
    assert "conversation_id" in named and private  # a model named, or a plan that keeps nothing: not told
    assert gw.conversation_owners.unlisted == [made]
    assert gw.conversation_owners.told == {made: "Call me ann."}  # its first prompt's instructions, carried


async def test_a_new_conversation_keeps_its_own_copy_of_the_instructions_unless_its_plan_keeps_nothing(
        client: Any) -> None:
    http, gw, _ = client
    made = (await http.post("/v1/conversations", json={}, headers=auth("ann"))).json()["conversation_id"]
    assert instructions_in(await gw.conversations.all_messages(made)) == "Call me ann."
    [(key, copy)] = [(k, m) for k, m in gw.conversations.messages.items() if k[0] == made]
    assert key == (made, -1, INSTRUCTIONS_ID) and copy.role == "system"
    private = (await http.post("/v1/conversations", json={}, headers=auth("pat"))).json()["conversation_id"]
    assert await gw.conversations.all_messages(private) == []


def test_a_message_reads_the_same_time_in_the_history_and_the_export() -> None:
    """A row saved on a whole second still shows its milliseconds, as the export writes it."""
    for at in (datetime(2026, 12, 5, 13, 46, 37), datetime(2026, 12, 5, 13, 46, 37, 353000)):
        m = Message("c1", 1, "m1", "user", "hi", created_at=at, finished_at=at)
        listed = routes_conversations.message_json(m)
        assert listed["created_at"] == exported(m)["created_at"]
        assert listed["created_at"].endswith(".000Z" if at.microsecond == 0 else ".353Z")
