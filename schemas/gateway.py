"""Events the HTTP gateway puts into the pipeline."""
from __future__ import annotations

from typing import Literal

import msgspec

from schemas.base import Event
from schemas.sampling import Sampling

PlanName = Literal["free", "paid", "private"]  # the account plans (their limits: infra/config/plans.py `Plan`)


class ChatTurn(msgspec.Struct, frozen=True):
    """One message of a history the client sends whole (the OpenAI-compatible API)."""

    role: Literal["system", "user", "assistant"]
    content: str


def own_client_message_id(generation_id: str) -> str:
    """The client_message_id of a request that brought none of its own and cannot be retried under one (the
    OpenAI-compatible endpoints): made from its generation's id, so no other request can hold it and the
    prompt build needs no claim on it."""
    return f"openai-{generation_id}"


class MessageSubmitted(Event, frozen=True, kw_only=True):
    """A user sent a message (or asked to regenerate a reply); topic ``chat.requests``."""

    generation_id: str
    conversation_id: str
    user_id: str
    plan: PlanName
    message_id: str  # the user message; for a regenerate, the existing one
    client_message_id: str
    content: str  # sealed with the conversation's data key (infra/stores/sealing.py)
    pool: str | None = None  # requested model pool; None = the default
    # A regenerate: the user message answered again. A new message: the reply it follows (its branch);
    # None = the conversation's newest reply.
    parent_id: str | None = None
    regenerate: bool = False
    edit_of: str | None = None  # an edited message: the user message it stands beside (same turn and parent)
    max_tokens: int | None = None
    temperature: float | None = None
    history: list[ChatTurn] | str | None = None  # set: the prompt is this history (str: sealed)
    gateway_id: str = ""
    deadline: float = 0.0  # epoch s: past it the client was told it failed; stages drop it (0: none)
    sampling: Sampling | str | None = None  # the client's sampling parameters; None: Parley's defaults
    # The gateway made the conversation for this request alone (an OpenAI call): the prompt stage reads nothing
    # of it (turn 0, the history is carried) and writes no placeholder (nobody can reopen it mid-reply).
    fresh_conversation: bool = False
    # The gateway made the conversation for this request alone and listed it (an OpenAI call its plan keeps):
    # persistence reads none of it and lists nothing (a reply with no text takes it off the list).
    made_listed: bool = False
    # The first message of a page conversation (untitled, no model named, so not listed), sent through the
    # gateway that made it, which saw no generation of it before (``Gateway.claim``): the prompt build reads no
    # history (``instructions`` is the conversation's copy of the custom instructions, sealed), and persistence
    # knows the row without reading it (made at its id's time) and lists it where it was made, unless someone
    # changed it since (its change mark) or a message came before (a later turn).
    made_unlisted: bool = False
    instructions: str | None = None


class CancelRequested(Event, frozen=True, kw_only=True):
    """Stop a generation: a user pressed stop, or nobody has read it for a while; ``chat.control``."""

    generation_id: str
    conversation_id: str
    user_id: str
    reason: Literal["user", "abandoned", "overflow", "deleted"] = "user"
