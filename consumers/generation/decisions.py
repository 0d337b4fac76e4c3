"""Pure decisions of the generation worker: what to do with one request, and how its reply ends.

No Kafka, no engine: (request, pool limits, cancels, saved tokens) -> a decision.
"""
from __future__ import annotations

from dataclasses import dataclass

from consumers.generation.recovery import Saved
from schemas import Block, GenerationFinished, GenerationRequested, Usage
from schemas.generation import Status


@dataclass(frozen=True)
class Limits:
    pool: str
    model: str
    max_model_len: int


@dataclass(frozen=True)
class Generate:
    prompt_token_ids: list[int]
    max_tokens: int
    first_seq: int
    resumed: bool
    priority: int


@dataclass(frozen=True)
class Finish:
    status: Status
    reason: str = ""


STALE_REQUEST_S = 600  # chat.tokens keeps 10 minutes: an older request has no stream left to resume


def is_stale(req: GenerationRequested, now: float) -> bool:
    """Requested longer ago than the token buffer keeps: skip it, publishing nothing (a reply saved for it
    stays as saved; a consumer group new to a lane reads it from the lane's start)."""
    return now - req.at > STALE_REQUEST_S


def decide(req: GenerationRequested, limits: Limits, cancelled: bool, saved: Saved) -> Generate | Finish:
    """Generate (from where the saved tokens end, at the priority the request's producer gave it) or finish."""
    if saved.finished is not None:
        return Finish(saved.finished.status, "already finished")
    if cancelled:
        return Finish("stopped", "cancelled before it started")
    if req.pool != limits.pool:
        return Finish("failed", f"request for pool {req.pool!r} reached a worker of pool {limits.pool!r}")
    if not req.prompt_token_ids:
        return Finish("failed", "empty prompt")
    if isinstance(req.prompt_token_ids, str):
        return Finish("failed", "the prompt reached the engine still sealed")
    if req.max_tokens < 1:
        return Finish("failed", f"max_tokens must be at least 1, got {req.max_tokens}")
    prompt = list(req.prompt_token_ids) + saved.token_ids
    remaining = req.max_tokens - len(saved.token_ids)
    if remaining < 1:
        return Finish("length", "reply cap reached before the worker died")
    if len(prompt) + 1 > limits.max_model_len:
        return Finish("failed", f"prompt of {len(prompt)} tokens does not fit the model's context of "
                                f"{limits.max_model_len} tokens")
    remaining = min(remaining, limits.max_model_len - len(prompt))
    return Generate(prompt, remaining, saved.next_seq, bool(saved.chunks), req.priority)


def status_for(finish_reason: str | None, cancelled: bool) -> Status:
    if cancelled or finish_reason == "abort":
        return "stopped"
    if finish_reason == "length":
        return "length"
    if finish_reason in ("stop", "eos"):
        return "complete"
    return "failed"


def finished_event(req: GenerationRequested, limits: Limits, worker_id: str, status: Status, text: str,
                   usage: Usage, last_seq: int, reason: str = "", started_at: float = 0.0,
                   first_token_at: float = 0.0, block: Block | None = None) -> GenerationFinished:
    return GenerationFinished(
        generation_id=req.generation_id, conversation_id=req.conversation_id, user_id=req.user_id,
        plan=req.plan, message_id=req.message_id, turn=req.turn, parent_id=req.parent_id, status=status,
        text=text, usage=usage, model=limits.model, pool=limits.pool, worker_id=worker_id, last_seq=last_seq,
        reason=reason, purpose=req.purpose, reserved_tokens=req.reserved_tokens, route_reason=req.route_reason,
        started_at=started_at, first_token_at=first_token_at, block=block, question=req.question,
        made_listed=req.made_listed, made_unlisted=req.made_unlisted)
