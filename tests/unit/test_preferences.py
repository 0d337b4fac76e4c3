"""The preferences store without services: custom instructions are sealed under a key of their own, each save
erases the words before it, and a conversation's copy is a message the prompt reads and the page does not show."""
from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from infra.stores.conversations import Message
from infra.stores.crypto import DataKeys, KeyGone, LocalTenantKeys
from infra.stores.preferences import (
    INSTRUCTIONS_ID,
    Preferences,
    Prefs,
    instructions_in,
    instructions_message,
    key_id,
    shown,
)
from infra.stores.sealing import Sealer, is_sealed, open_bytes
from tests.unit.test_sealing import KeyTable

SECRET = "my cat is called Bartholomew"


class Tables(KeyTable):
    """``conversation_keys`` (KeyTable's) and ``preferences``."""

    def __init__(self) -> None:
        super().__init__()
        self.prefs: dict[str, dict[str, Any]] = {}

    async def execute(self, cql: str, params: tuple[Any, ...] = ()) -> list[Any]:
        if "preferences" not in cql:
            return await super().execute(cql, params)
        user_id = params[-1] if not cql.startswith("SELECT") else params[0]
        if cql.startswith("SELECT"):
            row = self.prefs.get(user_id)
            return [SimpleNamespace(instructions=row.get("instructions"), default_model=row.get("default_model"))] \
                if row else []
        if cql.startswith("DELETE"):
            self.prefs.pop(user_id, None)
            return []
        column = cql.split("SET ")[1].split(" =")[0]
        self.prefs.setdefault(user_id, {})[column] = params[0]
        return []


@pytest.fixture
def tables() -> Tables:
    return Tables()


@pytest.fixture
def prefs(tmp_path: Path, tables: Tables) -> Preferences:
    return Preferences(tables, Sealer(DataKeys(tables, LocalTenantKeys.under(tmp_path), cache_s=60)))  # type: ignore[arg-type]


async def test_instructions_are_stored_sealed_and_read_back(prefs: Preferences, tables: Tables) -> None:
    assert await prefs.get("u1") == Prefs()
    await prefs.set_instructions("u1", SECRET)
    await prefs.set_default_model("u1", "small")
    stored = tables.prefs["u1"]["instructions"]
    assert is_sealed(stored) and "Bartholomew" not in stored
    assert key_id("u1") in tables.rows  # a key of the account's own, not a conversation's
    assert await prefs.get("u1") == Prefs(SECRET, "small")


async def test_each_save_and_a_clear_destroy_the_key_of_the_words_before(prefs: Preferences, tables: Tables) -> None:
    await prefs.set_instructions("u1", SECRET)
    old, old_key = tables.prefs["u1"]["instructions"], await prefs.sealer.keys.get(key_id("u1"))
    await prefs.set_instructions("u1", "Answer in French.")
    assert await prefs.get("u1") == Prefs("Answer in French.")
    with pytest.raises(KeyGone):  # the first words' key is gone: a copy of them left anywhere cannot be opened
        open_bytes(await prefs.sealer.keys.get(key_id("u1")), key_id("u1"), old)
    assert open_bytes(old_key, key_id("u1"), old).decode() == SECRET  # (only the destroyed key opened them)
    await prefs.set_instructions("u1", None)
    assert tables.prefs["u1"]["instructions"] is None and key_id("u1") not in tables.rows
    assert await prefs.get("u1") == Prefs()


def test_a_conversations_copy_is_read_by_the_prompt_and_hidden_from_the_page() -> None:
    at = datetime(2026, 12, 1, tzinfo=UTC)
    copy = instructions_message("c1", SECRET, at)
    assert (copy.turn, copy.message_id, copy.role) == (-1, INSTRUCTIONS_ID, "system")
    history = [copy, Message("c1", 0, "m0", "user", "hi"), Message("c1", 0, "a0", "assistant", "hello", parent_id="m0")]
    assert instructions_in(history) == SECRET
    assert [m.message_id for m in shown(history)] == ["m0", "a0"]
    assert instructions_in(history[1:]) is None
    gone = Message("c1", -1, INSTRUCTIONS_ID, "system", "")  # the conversation's key destroyed: no text
    assert instructions_in([gone, *history[1:]]) is None
