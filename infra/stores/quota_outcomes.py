"""What the quota scripts answer, as typed values, and the words a person reads.

Pure: no Redis here. ``infra/stores/quota.py`` turns script replies into these;
admission turns a ``Refusal`` into ``RequestRefused``; settlement and the reaper
turn a ``Settled`` into ``UsageRecorded``.
"""
from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Literal, cast

from infra.config.plans import Plan
from schemas import UsageRecorded
from schemas.gateway import PlanName
from schemas.generation import Status

RefusalReason = Literal["daily_budget", "rate_limit", "concurrency"]
ReservationState = Literal["admitted", "existing", "settled"]


@dataclass(frozen=True)
class Reservation:
    generation_id: str
    user_id: str
    plan: str
    day: str
    amount: int  # prompt estimate (trued up later) + reply cap
    prompt_tokens: int
    reply_cap: int
    conversation_id: str
    created_at: float
    expires_at: float
    state: ReservationState = "admitted"  # settled: it already ran, do not admit again


@dataclass(frozen=True)
class Refusal:
    reason: RefusalReason
    message: str
    retry_after_s: float
    status: int = 429


@dataclass(frozen=True)
class Settled:
    """The settled marker: the charge and everything a ``UsageRecorded`` needs."""

    generation_id: str
    user_id: str
    plan: str
    day: str
    conversation_id: str
    reserved: int
    tokens_in: int
    tokens_out: int
    tokens_cached: int
    charged: int
    status: str
    model: str
    pool: str
    started_at: float
    finished_at: float
    settled_at: float
    published: bool
    block_category: str = ""
    rules_version: str = ""

    @property
    def released(self) -> int:
        return max(0, self.reserved - self.charged)

    def usage_recorded(self) -> UsageRecorded:
        return UsageRecorded(
            generation_id=self.generation_id, conversation_id=self.conversation_id, user_id=self.user_id,
            plan=cast(PlanName, self.plan),  # plans are checked when the reservation is made
            model=self.model, pool=self.pool,
            status=cast(Status, self.status),  # written from the GenerationFinished it settles
            day=self.day, tokens_in=self.tokens_in, tokens_out=self.tokens_out, tokens_cached=self.tokens_cached,
            reserved_tokens=self.reserved, charged_tokens=self.charged, started_at=self.started_at,
            finished_at=self.finished_at or self.settled_at, block_category=self.block_category,
            rules_version=self.rules_version)


def utc_day(now: float) -> str:
    return datetime.fromtimestamp(now, UTC).strftime("%Y-%m-%d")


def next_midnight(now: float) -> float:
    today = datetime.fromtimestamp(now, UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    return (today + timedelta(days=1)).timestamp()


def reservation_from(fields: dict[str, str], state: str) -> Reservation:
    return Reservation(
        generation_id=fields["generation_id"], user_id=fields["user_id"], plan=fields["plan"], day=fields["day"],
        amount=int(fields["amount"]), prompt_tokens=int(fields["prompt"]), reply_cap=int(fields["reply_cap"]),
        conversation_id=fields.get("conversation_id", ""), created_at=float(fields["created_at"]),
        expires_at=float(fields.get("expires_at", 0) or 0),
        state=cast(ReservationState, state))  # what the reserve script answers: admitted, existing or settled


def settled_from(fields: dict[str, str]) -> Settled:
    def num(name: str) -> float:
        return float(fields.get(name) or 0)

    return Settled(
        generation_id=fields["generation_id"], user_id=fields["user_id"], plan=fields["plan"], day=fields["day"],
        conversation_id=fields.get("conversation_id", ""), reserved=int(fields["amount"]),
        tokens_in=int(fields["tokens_in"]), tokens_out=int(fields["tokens_out"]),
        tokens_cached=int(num("tokens_cached")), charged=int(fields["charged"]),
        status=fields.get("status") or "complete", model=fields.get("model", ""), pool=fields.get("pool", ""),
        started_at=num("started_at"), finished_at=num("finished_at"), settled_at=num("settled_at"),
        published=fields.get("published") == "1", block_category=fields.get("block_category", ""),
        rules_version=fields.get("rules_version", ""))


def refusal(plan: Plan, reason: str, detail: str, detail2: str, want: int, now: float,
            concurrency_retry_s: float) -> Refusal:
    """The script's refusal, with a retry time and a message naming the limit and when it resets."""
    if reason == "daily_budget":
        left = max(0, plan.daily_tokens - int(float(detail)))
        # Tokens remain but fewer than a full reply may need: "limit reached" beside a non-zero figure reads wrong.
        said = (f"Not enough left today for a full reply: {left:,} of your {plan.daily_tokens:,} daily tokens "
                f"remain and this request needs up to {want:,}" if left
                else f"Daily limit of {plan.daily_tokens:,} tokens reached")
        return Refusal("daily_budget", f"{said} — resets at 00:00 UTC", retry_after_s=_ceil(next_midnight(now) - now))
    if reason == "concurrency":
        # A running reply usually ends within seconds; its expiry is only the upper bound.
        until_expiry = float(detail2) - now if detail2 else concurrency_retry_s
        wait = _ceil(max(1.0, min(concurrency_retry_s, until_expiry)))
        return Refusal("concurrency", f"You already have {plan.max_running} replies being written, the limit "
                                      f"at once — try again when one finishes (about {wait:g} s)", wait)
    rate = plan.bucket_tokens_per_minute / 60
    wait = _ceil((min(want, plan.bucket_burst) - float(detail)) / rate)
    return Refusal("rate_limit", f"Per-minute limit of {plan.bucket_tokens_per_minute:,} tokens "
                                 f"(bursts up to {plan.bucket_burst:,}) reached — try again in {wait:g} s", wait)


def _ceil(seconds: float) -> float:
    return float(max(1, int(-(-seconds // 1))))
