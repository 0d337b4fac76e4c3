"""The prompt build stage's output: token ids ready for an engine."""
from __future__ import annotations

import msgspec

from schemas.base import Event
from schemas.gateway import PlanName
from schemas.sampling import Sampling


class PoolPrompt(msgspec.Struct, frozen=True, kw_only=True):
    """The same request fitted for another pool it may be sent to (the scheduler's overflow)."""

    pool: str
    max_tokens: int
    prompt_token_ids: list[int] | None = None  # None: the main prompt's ids are valid there as they are


class PromptBuilt(Event, frozen=True, kw_only=True):
    """User message saved, history fitted to the pool's window; topic ``chat.prompts``."""

    generation_id: str
    conversation_id: str
    user_id: str
    plan: PlanName
    pool: str
    user_message_id: str
    assistant_message_id: str
    turn: int
    prompt_token_ids: list[int] | str  # str: sealed
    max_tokens: int
    reserved_tokens: int
    turns_kept: int = 0
    summary_used: bool = False
    route_reason: str = "default"
    temperature: float | None = None
    deadline: float = 0.0  # epoch s: past it the client was told it failed; stages drop it (0: none)
    question: str = ""  # the user's message: the last-resort tier's prepared replies; persistence indexes it
    made_listed: bool = False  # see MessageSubmitted: carried to the finish on chat.replies
    made_unlisted: bool = False  # see MessageSubmitted: carried to the finish on chat.replies
    sampling: Sampling | str | None = None
    # A pool missing here (and not ``pool``) cannot take this request. str: sealed (an alternate's ids spell the
    # prompt, refitted for another pool's window).
    alternates: list[PoolPrompt] | str = []
