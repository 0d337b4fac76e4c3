"""The sampling parameters a client may send, checked once for every endpoint that takes them.

The same names and ranges as OpenAI's Chat Completions API plus vLLM's own extensions (``top_k``,
``min_p``, ``repetition_penalty``, ``min_tokens``, ``ignore_eos``), so clients written for either run
unchanged. A bad value raises ``CompatError`` (a 400 that names the parameter); the native message
endpoint re-raises it in its own shape.
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import msgspec
import orjson

from producers.gateway import schema_bounds
from producers.gateway.errors import ApiError
from schemas.sampling import ResponseFormat, Sampling

NAMES = frozenset({"temperature", "top_p", "top_k", "min_p", "seed", "stop", "presence_penalty",
                   "frequency_penalty", "repetition_penalty", "min_tokens", "ignore_eos", "logprobs",
                   "top_logprobs", "response_format", "n"})
MAX_STOP = 4  # OpenAI's limit; each stop string is checked against the text on every step
MAX_STOP_CHARS = 100
MAX_TOP_LOGPROBS = 20  # the engine's max_logprobs
MAX_N = 4  # each choice is its own generation, and counts against the plan's replies-at-once cap
MAX_SCHEMA_CHARS = 16_000
MAX_REPLY_TOKENS = 1 << 20  # far above any pool's window; the plan's reply cap applies below it
MAX_SEED = (1 << 63) - 1  # the engine's seed is a signed 64-bit integer


class CompatError(ApiError):
    """An error raised in OpenAI's terms: it names the offending parameter."""

    def __init__(self, status: int, code: str | None, message: str, param: str | None = None,
                 type_: str = "invalid_request_error") -> None:
        super().__init__(status, code or "", message)
        self.param, self.type = param, type_


def invalid(message: str, param: str | None = None, code: str | None = None) -> CompatError:
    return CompatError(400, code, message, param)


@dataclass(frozen=True)
class Parsed:
    temperature: float | None
    sampling: Sampling | None  # None: nothing beyond temperature was asked
    n: int = 1


def parse(body: Mapping[str, Any], max_tokens: int | None = None) -> Parsed:
    """``body``'s sampling fields; ``max_tokens`` (already checked) bounds ``min_tokens``."""
    top_logprobs = _int(body, "top_logprobs", 0, MAX_TOP_LOGPROBS) or 0
    logprobs = _bool(body, "logprobs")
    if top_logprobs and not logprobs:
        raise invalid("'top_logprobs' needs 'logprobs' set to true.", "top_logprobs")
    min_tokens = _int(body, "min_tokens", 0, max_tokens if max_tokens is not None else MAX_REPLY_TOKENS)
    fields: dict[str, Any] = {  # one value per Sampling field, each of its field's type
        "top_p": _number(body, "top_p", 0.0, 1.0, open_low=True), "top_k": _int(body, "top_k", -1, 1 << 20),
        "min_p": _number(body, "min_p", 0.0, 1.0), "seed": _int(body, "seed", -MAX_SEED - 1, MAX_SEED),
        "stop": _stop(body.get("stop")),
        "presence_penalty": _number(body, "presence_penalty", -2.0, 2.0),
        "frequency_penalty": _number(body, "frequency_penalty", -2.0, 2.0),
        "repetition_penalty": _number(body, "repetition_penalty", 0.0, 2.0, open_low=True),
        "min_tokens": min_tokens, "ignore_eos": _bool(body, "ignore_eos"), "logprobs": logprobs,
        "top_logprobs": top_logprobs, "response_format": _response_format(body.get("response_format")),
    }
    asked = {k: v for k, v in fields.items() if v not in (None, False, 0) or (k == "seed" and v is not None)}
    n = _int(body, "n", 1, MAX_N)
    return Parsed(_number(body, "temperature", 0.0, 2.0), Sampling(**asked) if asked else None, n or 1)


# What OpenAI's API reference gives a request that names neither; the page's own replies sample at 0.7 with
# top_p 0.95 instead (consumers/generation/sampling.py).
OPENAI_TEMPERATURE, OPENAI_TOP_P = 1.0, 1.0


def openai_defaults(parsed: Parsed) -> Parsed:
    """The OpenAI endpoints' defaults, for an app that talks to Parley as it talks to OpenAI: temperature 1 and
    top_p 1 (no nucleus filter) when the request names none. Also what vLLM's own server does, and cheaper: for
    any top_p below 1 a CPU engine sorts the whole vocabulary per sequence per step."""
    sampling = parsed.sampling or Sampling()
    if sampling.top_p is None:
        sampling = msgspec.structs.replace(sampling, top_p=OPENAI_TOP_P)
    temperature = OPENAI_TEMPERATURE if parsed.temperature is None else parsed.temperature
    return Parsed(temperature, sampling, parsed.n)


def reply_cap(body: Mapping[str, Any], name: str) -> int | None:
    """A reply cap (``max_tokens`` and its aliases): a whole number from 1 to ``MAX_REPLY_TOKENS``."""
    return _int(body, name, 1, MAX_REPLY_TOKENS)


def for_choice(sampling: Sampling | None, index: int) -> Sampling | None:
    """Choice ``index`` of ``n``: a seeded request gives each choice its own seed (seed + index), or
    every choice would be the same text."""
    if sampling is None or sampling.seed is None or index == 0:
        return sampling
    fields = {f: getattr(sampling, f) for f in sampling.__struct_fields__}
    return Sampling(**{**fields, "seed": sampling.seed + index})


def _number(body: Mapping[str, Any], name: str, low: float, high: float, open_low: bool = False) -> float | None:
    value = body.get(name)
    if value is None:
        return None
    # An int too large for a float (10**400) is out of range, not a crash in isfinite.
    bad = isinstance(value, bool) or not isinstance(value, (int, float)) or (
        isinstance(value, float) and not math.isfinite(value))
    if bad or value > high or value < low or (open_low and value == low):
        side = f"greater than {low:g}" if open_low else f"at least {low:g}"
        raise invalid(f"'{name}' must be a number {side} and at most {high:g}; got {_shown(value)}.", name)
    return float(value)


def _int(body: Mapping[str, Any], name: str, low: int, high: int) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise invalid(f"'{name}' must be a whole number from {low} to {high}; got {_shown(value)}.", name)
    return value


def _shown(value: Any) -> str:
    text = repr(value) if not isinstance(value, int) or abs(value) < 10**30 else f"a {len(str(value))}-digit number"
    return text if len(text) <= 40 else text[:40] + "..."



def _bool(body: Mapping[str, Any], name: str) -> bool:
    value = body.get(name)
    if value is None or isinstance(value, bool):
        return bool(value)
    raise invalid(f"'{name}' must be true or false.", name)


def _stop(value: Any) -> list[str] | None:
    if value is None or value == "" or value == []:
        return None
    stops = [value] if isinstance(value, str) else value
    if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops):
        raise invalid("'stop' must be a non-empty string or an array of non-empty strings.", "stop")
    if len(stops) > MAX_STOP or any(len(s) > MAX_STOP_CHARS for s in stops):
        raise invalid(f"'stop' takes at most {MAX_STOP} sequences of at most {MAX_STOP_CHARS} characters.", "stop")
    return list(stops)


def _response_format(value: Any) -> ResponseFormat | None:
    if value is None:
        return None
    kind = value.get("type") if isinstance(value, dict) else None
    if kind == "text":
        return None
    if kind == "json_object":
        return ResponseFormat(type="json_object")
    if kind != "json_schema":
        raise invalid("'response_format.type' must be one of text, json_object, json_schema.", "response_format")
    spec = value.get("json_schema")
    schema = spec.get("schema") if isinstance(spec, dict) else None
    if not isinstance(schema, dict):
        raise invalid("'response_format.json_schema.schema' must be a JSON Schema object.",
                      "response_format.json_schema")
    try:
        schema_bounds.check(schema)  # before encoding: a schema nested past orjson's depth is refused here
    except schema_bounds.SchemaTooCostly as exc:
        param = ".".join(filter(None, ["response_format.json_schema.schema", exc.where]))
        raise invalid(f"The JSON schema is too costly to compile: {exc}.", param, "schema_too_costly") from exc
    text = orjson.dumps(schema).decode()
    if len(text) > MAX_SCHEMA_CHARS:
        raise invalid(f"The JSON schema is {len(text):,} characters; the limit is {MAX_SCHEMA_CHARS:,}.",
                      "response_format.json_schema")
    return ResponseFormat(type="json_schema", json_schema=text)
