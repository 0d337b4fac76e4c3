"""How a reply is sampled, as the client asked: one optional struct carried from the gateway to the worker.

Every field defaults to "not asked" so a record written before this struct existed decodes
unchanged, and the worker falls back to Parley's own sampling. Temperature stays the events'
own ``temperature`` field (older than this struct).
"""
from __future__ import annotations

from typing import Literal

import msgspec


class ResponseFormat(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """Structured output: any JSON object, or JSON matching a schema (kept as JSON text: events stay typed)."""

    type: Literal["json_object", "json_schema"]
    json_schema: str | None = None


class Sampling(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    seed: int | None = None
    stop: list[str] | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    repetition_penalty: float | None = None
    min_tokens: int | None = None
    ignore_eos: bool = False
    logprobs: bool = False
    top_logprobs: int = 0
    response_format: ResponseFormat | None = None
    # The reply is read for function calls: "json", written as guided JSON (``response_format``), which any
    # vLLM pool honours; "hermes", as <tool_call> blocks in free text, which only a pool that declares the
    # Hermes tool parser is set up to write. A request is never moved to a pool that cannot honour it.
    tool_call: Literal["json", "hermes"] | None = None


class TopLogprob(msgspec.Struct, frozen=True, array_like=True):
    token: str
    logprob: float


class TokenLogprob(msgspec.Struct, frozen=True, array_like=True):
    """One sampled token with its log probability and, if asked, the most likely alternatives."""

    token: str
    logprob: float
    top: list[TopLogprob] = []
