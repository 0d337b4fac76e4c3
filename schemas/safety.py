"""What the safety checks decide: a message refused at admission, a reply retracted while streaming."""
from __future__ import annotations

from typing import Literal

import msgspec

from schemas.base import Event
from schemas.gateway import PlanName


class Block(msgspec.Struct, frozen=True, kw_only=True):
    """Why a text was blocked: never the text itself, nor the rule that matched."""

    check: Literal["input", "output"]
    category: str
    score: float
    rules_version: str


class InputBlocked(Event, frozen=True, kw_only=True):
    """Admission's input check flagged a message; nothing was reserved. Topic ``chat.admitted``, where the
    prompt build saves the user message as ``blocked`` (the gateway got a ``RequestRefused`` already)."""

    generation_id: str
    conversation_id: str
    user_id: str
    plan: PlanName
    message_id: str
    client_message_id: str
    regenerate: bool = False
    block: Block
    notice: str


class GenerationRetracted(Event, frozen=True, kw_only=True):
    """The output check flagged a chunk: every reader replaces what it showed with ``notice``; topic
    ``chat.tokens``, right before the ``GenerationFinished`` with status ``blocked``."""

    generation_id: str
    conversation_id: str
    user_id: str
    last_seq: int  # the last TokensAppended a reader may have shown (-1: none was shown)
    block: Block
    notice: str
