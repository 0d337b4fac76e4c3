"""Settlement's record of a charged reply; topic ``usage``, read by analysts and billing."""
from __future__ import annotations

from schemas.base import Event
from schemas.gateway import PlanName
from schemas.generation import Status


class UsageRecorded(Event, frozen=True, kw_only=True):
    generation_id: str
    conversation_id: str
    user_id: str
    plan: PlanName
    model: str
    pool: str
    status: Status
    day: str  # UTC, YYYY-MM-DD, the day the reservation was made
    tokens_in: int
    tokens_out: int
    tokens_cached: int
    reserved_tokens: int
    charged_tokens: int
    started_at: float = 0.0
    finished_at: float = 0.0
    block_category: str = ""  # status blocked: the category and the rules version that decided it
    rules_version: str = ""
