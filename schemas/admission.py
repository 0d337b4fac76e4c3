"""Admission's decisions: a request admitted with its reservation, or refused at once."""
from __future__ import annotations

from typing import Literal

from schemas.base import Event
from schemas.gateway import ChatTurn, PlanName
from schemas.sampling import Sampling


class RequestAdmitted(Event, frozen=True, kw_only=True):
    """Budget reserved (prompt estimate + reply cap); topic ``chat.admitted``."""

    generation_id: str
    conversation_id: str
    user_id: str
    plan: PlanName
    message_id: str
    client_message_id: str
    content: str
    pool: str
    parent_id: str | None = None
    regenerate: bool = False
    edit_of: str | None = None
    reply_cap: int
    reserved_tokens: int
    route_reason: str = "default"  # why this pool: default, requested, classifier
    temperature: float | None = None
    deadline: float = 0.0  # epoch s: past it the client was told it failed; stages drop it (0: none)
    history: list[ChatTurn] | str | None = None  # str: sealed
    sampling: Sampling | str | None = None
    # The gateway made the conversation for this request alone (an OpenAI call): the prompt stage reads nothing
    # of it (turn 0, the history is carried) and writes no placeholder (nobody can reopen it mid-reply).
    fresh_conversation: bool = False
    made_listed: bool = False  # see MessageSubmitted
    made_unlisted: bool = False  # see MessageSubmitted
    instructions: str | None = None  # see MessageSubmitted (sealed)


RefusalReason = Literal[
    "daily_budget", "rate_limit", "concurrency", "queue_full", "overloaded", "invalid", "too_long", "blocked"
]


class RequestRefused(Event, frozen=True, kw_only=True):
    """A request that will not be generated, with a message a person can act on; ``chat.tokens``."""

    generation_id: str
    conversation_id: str
    user_id: str
    reason: RefusalReason
    message: str
    status: int = 429
    retry_after_s: float | None = None
