"""Which user owns a conversation, remembered by the gateway while a deletion would be heard.

A send checks that the conversation is the caller's and not deleted: a Cassandra read on the first token's
path, the same answer for every turn. A deletion destroys the conversation's data key, and the data keys
(``DataKeys``) hear every destruction on Redis: an owner is kept only while they do (``DataKeys.live``), and
dropped the moment its key is forgotten here, so a deleted conversation is refused on every gateway as soon as
its deletion is heard — and, while nothing can be heard, nothing is kept.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

from infra.stores.conversations import Conversations
from infra.stores.crypto import DataKeys

KEEP_S = 300.0
MOST = 100_000  # conversations remembered at once; the oldest entries go first past it


@dataclass(frozen=True)
class FirstMessage:
    instructions: str | None  # the conversation's copy of the custom instructions


class Owners:
    def __init__(self, conversations: Conversations, keys: DataKeys, keep_s: float = KEEP_S) -> None:
        self.conversations, self.keys, self.keep_s = conversations, keys, keep_s
        self._owners: dict[str, tuple[float, str]] = {}
        # Made here untitled with no model named, no message sent here yet: until when, and its copy of the
        # custom instructions (what its first prompt needs besides the message, so nothing is read for it).
        self._unlisted: dict[str, tuple[float, str | None]] = {}
        keys.listeners.append(self._forget)

    async def owner(self, conversation_id: str) -> str | None:
        """The live conversation's owner; None when there is none (missing or deleted)."""
        hit = self._owners.get(conversation_id)
        if hit is not None and hit[0] > time.monotonic():
            return hit[1]
        heard = self.keys.heard
        conv = await self.conversations.get(conversation_id)
        if conv is None:
            self._owners.pop(conversation_id, None)
            return None
        self.made(conversation_id, conv.user_id, heard)
        return conv.user_id

    def made(self, conversation_id: str, user_id: str, heard: int) -> None:
        """Remember an owner read (or a conversation made) while ``heard`` was current, if no destruction or
        loss of the channel came since: a conversation's first message on the gateway that made it reads
        nothing."""
        if self.keys.live(heard):
            if len(self._owners) >= MOST:
                self._owners.pop(next(iter(self._owners)))
            self._owners[conversation_id] = (time.monotonic() + self.keep_s, user_id)

    def made_unlisted(self, conversation_id: str, instructions: str | None) -> None:
        """A page conversation made here with no title and no model: not listed, its row as its id says, its
        history nothing but ``instructions`` (its copy of the custom instructions, or none)."""
        if len(self._unlisted) >= MOST:
            self._unlisted.pop(next(iter(self._unlisted)))
        self._unlisted[conversation_id] = (time.monotonic() + self.keep_s, instructions)

    def first_message(self, conversation_id: str) -> FirstMessage | None:
        """The first message sent here to a conversation made here unlisted (asked once: then forgotten), or
        None. Whether it is the conversation's first anywhere is settled by ``Gateway.claim``."""
        made = self._unlisted.pop(conversation_id, None)
        return FirstMessage(made[1]) if made is not None and made[0] > time.monotonic() else None

    def _forget(self, conversation_id: str | None) -> None:
        if conversation_id is None:
            self._owners.clear()
            self._unlisted.clear()
        else:
            self._owners.pop(conversation_id, None)
            self._unlisted.pop(conversation_id, None)
