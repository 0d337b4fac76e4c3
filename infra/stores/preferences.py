"""A user's settings (``preferences``): custom instructions, and the model new chats start with.

Instructions are user-written text, so they are stored sealed like message text, with a data key of their own
(``conversation_keys`` row ``account:<user_id>``). Each save makes a new key and destroys the old one, and
clearing them destroys it too: an earlier version left in Cassandra's files or a backup is ciphertext nobody
can open.

A conversation made while instructions are set keeps its own copy, sealed with the conversation's key, as a
``system`` message at turn -1 (``INSTRUCTIONS_ID``). The prompt build reads it with the history it reads anyway,
so a chat message costs no extra round trip, and deleting or purging the conversation takes the copy with its
messages. New instructions apply to conversations made afterwards; an older one keeps the words it began with,
so its prompts keep the same first tokens (the engine's prefix cache).
"""
from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

from infra.stores.conversations import Message
from infra.stores.sealing import Sealer
from infra.stores.session import AsyncSession

MAX_INSTRUCTIONS_CHARS = 4_000
INSTRUCTIONS_TURN = -1  # before the first turn: never a user's or a reply's turn
INSTRUCTIONS_ID = "instructions"


def key_id(user_id: str) -> str:
    """The id the account's instructions are sealed under (never a conversation id: those are ``new_id()``s)."""
    return f"account:{user_id}"


@dataclass(frozen=True)
class Prefs:
    instructions: str | None = None
    default_model: str | None = None


class Preferences:
    def __init__(self, db: AsyncSession, sealer: Sealer) -> None:
        self.db, self.sealer = db, sealer

    async def get(self, user_id: str) -> Prefs:
        rows = await self.db.execute("SELECT instructions, default_model FROM preferences WHERE user_id = ?",
                                     (user_id,))
        if not rows:
            return Prefs()
        sealed = rows[0].instructions
        text = await self.sealer.open_text(key_id(user_id), sealed) if sealed else None
        return Prefs(text or None, rows[0].default_model)

    async def set_instructions(self, user_id: str, text: str | None) -> None:
        """Replace (or, with None, clear) the instructions; the key that sealed the old ones is destroyed."""
        keys, kid = self.sealer.keys, key_id(user_id)
        await keys.destroy(kid)
        sealed = None
        if text:
            await keys.create(kid, user_id)
            sealed = await self.sealer.seal_text(kid, text)
        await self.db.execute("UPDATE preferences SET instructions = ?, updated_at = ? WHERE user_id = ?",
                              (sealed, datetime.now(UTC), user_id))

    async def set_default_model(self, user_id: str, model: str | None) -> None:
        await self.db.execute("UPDATE preferences SET default_model = ?, updated_at = ? WHERE user_id = ?",
                              (model, datetime.now(UTC), user_id))


def instructions_message(conversation_id: str, text: str, at: datetime) -> Message:
    """A new conversation's copy of the instructions (``Conversations.save_message`` seals it)."""
    return Message(conversation_id, INSTRUCTIONS_TURN, INSTRUCTIONS_ID, "system", text, status="complete",
                   created_at=at)


def instructions_in(history: list[Message]) -> str | None:
    """The conversation's instructions, from its history (None: it has none, or its key is gone)."""
    return next((m.content for m in history if m.message_id == INSTRUCTIONS_ID and m.role == "system"), None) or None


def shown(history: list[Message]) -> list[Message]:
    """The messages a person sees: the instructions' copy is part of the prompt, not of the conversation."""
    return [m for m in history if m.role != "system"]
