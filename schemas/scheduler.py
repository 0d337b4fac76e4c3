"""The queue per plan: what it tells the client and what it hands a worker."""
from __future__ import annotations

from typing import Literal

from schemas.base import Event
from schemas.gateway import PlanName
from schemas.sampling import Sampling

Lane = Literal["paid", "free"]
# The one table of lanes: in the order they are served, each with the engine priority its requests run at
# (vLLM runs lower values first). Topics, plans, the scheduler's queues and the worker all read it.
LANE_PRIORITY: dict[Lane, int] = {"paid": 0, "free": 10}
LANES: tuple[Lane, ...] = tuple(LANE_PRIORITY)
BACKGROUND_PRIORITY = 20  # the service's own calls (titles, summaries): behind every user's reply
Purpose = Literal["reply", "title", "summary"]


class GenerationQueued(Event, frozen=True, kw_only=True):
    """Where a request stands in its lane; topic ``chat.tokens`` (relayed as a ``queued`` SSE event)."""

    generation_id: str
    conversation_id: str
    user_id: str
    pool: str
    model: str
    lane: Lane
    position: int
    estimated_wait_s: float  # to the first token, from ``at``; counted down by the client between revisions
    message_id: str = ""
    revision: int = 0  # 0: the scheduler's decision; 1, 2, ...: a newer estimate while the request still waits
    # Why ``pool`` answers: "overflow" (``requested_pool`` was past the plan's wait limit) and "canned" (every pool
    # was: a prepared reply) are fallbacks the client is told of at once; else admission's reason.
    route_reason: str = "default"
    requested_pool: str = ""  # the pool the request was for ("" in events from before this field)


class GenerationRequested(Event, frozen=True, kw_only=True):
    """Work for one worker pool; topic ``generate.<pool>.<lane>``, keyed by conversation."""

    generation_id: str
    conversation_id: str
    user_id: str
    plan: PlanName
    pool: str
    lane: Lane
    prompt_token_ids: list[int] | str  # str: sealed
    max_tokens: int
    priority: int = 0  # lower runs first (vLLM's convention)
    message_id: str = ""  # the assistant message this generation writes
    turn: int = 0
    parent_id: str | None = None
    purpose: Purpose = "reply"
    temperature: float = 0.7  # 0 = greedy; replies sample so a regenerate gives a different sibling
    reserved_tokens: int = 0
    route_reason: str = "default"
    enqueued_at: float = 0.0
    sampling: Sampling | str | None = None  # kept on redelivery: a recovering worker samples the same way
    question: str = ""  # the user message it answers, carried to the finish on chat.replies (sealed)
    made_listed: bool = False  # see MessageSubmitted: carried to the finish on chat.replies
    made_unlisted: bool = False  # see MessageSubmitted: carried to the finish on chat.replies
