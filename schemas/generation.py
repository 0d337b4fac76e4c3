"""What a generation worker appends: start, token batches, finish."""
from __future__ import annotations

from typing import Literal

import msgspec

from schemas.base import Event
from schemas.gateway import PlanName
from schemas.safety import Block
from schemas.sampling import TokenLogprob
from schemas.scheduler import Purpose

Status = Literal["complete", "stopped", "length", "failed", "blocked"]


class GenerationStarted(Event, frozen=True, kw_only=True):
    """The first token exists; topic ``chat.tokens``."""

    generation_id: str
    conversation_id: str
    user_id: str
    message_id: str
    model: str
    pool: str
    worker_id: str
    first_token_at: float
    prompt_tokens: int
    cached_prompt_tokens: int = 0
    resumed: bool = False
    epoch: int = 0  # the owner's fencing epoch: readers ignore events of an epoch older than one they saw


class TokensAppended(Event, frozen=True, kw_only=True, omit_defaults=True):
    """The tokens one flush window gathered for one sequence; topic ``chat.tokens``.

    Sealed, a record carries ``text``, ``token_ids`` and ``logprobs`` together in ``sealed`` (one payload, one
    seal) and leaves the three empty until a reader opens it. Fields at their defaults are not written, and the
    worker writes no ``generation_id``: the record key is the generation id, and ``decode`` given the key fills it
    in (records written before carry it); nor ``at``, which the record's timestamp gives. No reader needs the user
    (``user_id`` stays for records written before).
    """

    generation_id: str = ""  # the record key; empty in the value as written
    at: float = 0.0  # not written: the record's Kafka timestamp (``decode_record`` fills it in)
    conversation_id: str  # whose data key seals the payload (and the seal's associated data)
    user_id: str = ""  # not written by the worker
    seq: int  # per generation, from 0, no gaps
    text: str = ""
    token_ids: list[int] | str = []  # str: sealed on its own (records written before ``sealed``)
    logprobs: list[TokenLogprob] | str | None = None  # one per token id, only when the client asked; str: sealed
    epoch: int = 0  # the owner's fencing epoch (see GenerationStarted)
    sealed: str = ""  # text, token ids and logprobs, sealed together


class Usage(msgspec.Struct, frozen=True, kw_only=True):
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_prompt_tokens: int = 0


class GenerationFinished(Event, frozen=True, kw_only=True):
    """A reply ended; on ``chat.tokens`` (for readers) and ``chat.replies`` (for settlement, persistence)."""

    generation_id: str
    conversation_id: str
    user_id: str
    plan: PlanName
    message_id: str
    turn: int = 0
    parent_id: str | None = None
    status: Status
    text: str
    usage: Usage
    model: str
    pool: str
    worker_id: str
    last_seq: int = -1
    reason: str = ""  # why it failed, for a person
    purpose: Purpose = "reply"
    reserved_tokens: int = 0
    route_reason: str = "default"
    started_at: float = 0.0
    first_token_at: float = 0.0
    epoch: int = 0  # the owner's fencing epoch (see GenerationStarted)
    block: Block | None = None  # status blocked: why (the text is the notice)
    # The user message it answers (sealed), on ``chat.replies`` only: persistence indexes it and asks a title
    # with it without reading it back. Empty on ``chat.tokens`` and where no request carried it (then read).
    question: str = ""
    made_listed: bool = False  # see MessageSubmitted: persistence reads none of the conversation
    made_unlisted: bool = False  # see MessageSubmitted: persistence reads none of it, lists it where made
