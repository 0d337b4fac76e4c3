"""The OpenAI Chat Completions dialect, translated both ways, with no I/O.

In: a request body -> ``ChatRequest`` (pool, history, reply cap, sampling, n), or a 400
that names the unsupported parameter (sampling values are checked in ``sampling_params``).
Out: Parley's events -> ``chat.completion`` objects, ``chat.completion.chunk`` SSE lines, and
errors in OpenAI's shape ``{"error": {"message", "type", "param", "code"}}``, used only on ``OPENAI_PATHS``.
"""
from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

import msgspec
import orjson
from starlette.responses import JSONResponse

from producers.gateway import sampling_params, tools
from producers.gateway import tool_calls as calls
from producers.gateway.errors import ApiError
from producers.gateway.sampling_params import CompatError, invalid
from producers.gateway.text import first_non_unicode
from schemas import GenerationFinished, Usage, id_time_ms
from schemas.gateway import ChatTurn
from schemas.sampling import ResponseFormat, Sampling, TokenLogprob

__all__ = ["CompatError", "invalid"]
# OpenAI's own paths: their errors (and unknown paths under /v1) answer in OpenAI's shape.
OPENAI_PATHS = frozenset({"/v1/chat/completions", "/v1/models", "/v1/responses"})
OPENAI_PREFIXES = ("/v1/models/", "/v1/responses/")
STARTED = int(time.time())  # "created" of every model: when this gateway started
DONE = b"data: [DONE]\n\n"
FINISH_REASONS = {"complete": "stop", "stopped": "stop", "length": "length",  # failed -> an error
                  "blocked": "content_filter"}  # the output check cut the reply; its text is the notice
# Messages in one request: a prompt of the largest pool's context holds fewer (each costs its template's
# tokens), and checking the count first refuses a history of tiny messages before it is walked, sealed and
# encoded (30,001 four-character messages cost the gateway 138 ms to refuse at encoding, 2 ms here)
MAX_MESSAGES = 2048
HISTORY_CHARS_FACTOR = 4  # all messages together: up to 4x the one-message limit (Kafka's record size)
ROLES: dict[str, Literal["system", "user", "assistant"]] = {"system": "system", "developer": "system", "user": "user",
                                                           "assistant": "assistant"}
IGNORED = frozenset({"user", "store", "metadata", "service_tier", "safety_identifier", "prompt_cache_key"})
TOOL_PARAMS = frozenset({"tools", "tool_choice", "parallel_tool_calls", "functions", "function_call"})
# Parameters Parley does not implement: accepted only at the value that means "not used".
UNSUPPORTED: dict[str, tuple[tuple[Any, ...], str]] = {
    "audio": ((None,), "Parley has no audio output."),
    "modalities": ((None, ["text"]), "Parley replies in text only (['text'])."),
    "logit_bias": ((None, {}), "Parley has no logit bias: token ids differ between its pools' tokenizers."),
    "prediction": ((None,), "Parley has no predicted outputs."),
    "reasoning_effort": ((None,), "Parley's models are not reasoning models."),
    "verbosity": ((None,), "Parley has no verbosity setting."),
    "web_search_options": ((None,), "Parley has no web search."),
}
KNOWN = frozenset({"model", "messages", "stream", "stream_options", "max_tokens", "max_completion_tokens"}) \
    | sampling_params.NAMES | IGNORED | UNSUPPORTED.keys() | TOOL_PARAMS


@dataclass(frozen=True)
class ChatRequest:
    pool: str
    history: list[ChatTurn]  # the last one is the user's question
    max_tokens: int | None
    temperature: float | None
    stream: bool
    include_usage: bool
    sampling: Sampling | None = None
    n: int = 1
    tools: tools.ToolRequest | None = None  # None: no tools, or tool_choice none with no calls in the history

    @property
    def content(self) -> str:
        return self.history[-1].content

    @property
    def title(self) -> str:
        return " ".join(self.content.split())[:60]


def parse(body: Any, models: Mapping[str, str], default_pool: str, max_message_chars: int) -> ChatRequest:
    if not isinstance(body, dict):
        raise invalid("The request body must be a JSON object.")
    too_many("messages", body.get("messages"))
    bad_text = first_non_unicode(body)
    if bad_text is not None:
        raise CompatError(422, "invalid_text", f"'{bad_text}' is not valid Unicode text (it contains a lone "
                                               "surrogate such as \\ud800).", bad_text)
    unknown = sorted(set(body) - KNOWN)
    if unknown:
        raise invalid(f"Unrecognized request argument supplied: {unknown[0]}", unknown[0])
    for name, (unused, why) in UNSUPPORTED.items():
        if body.get(name) not in unused:
            raise invalid(f"'{name}' is not supported: {why}", name, "unsupported_parameter")
    pool = resolve_model(body.get("model"), models, default_pool)
    tool_request = tools.parse(body)
    history = messages(body.get("messages"), max_message_chars, tool_request)
    stream = _bool(body.get("stream"), "stream")
    max_tokens = _max_tokens(body)
    sampled = sampling_params.openai_defaults(sampling_params.parse(body, max_tokens))
    return ChatRequest(pool, history, max_tokens, sampled.temperature, stream,
                       _include_usage(body.get("stream_options"), stream),
                       with_tools(sampled.sampling, tool_request), sampled.n,
                       tool_request if tool_request is not None and tool_request.calls else None)


def with_tools(sampling: Sampling | None, request: tools.ToolRequest | None) -> Sampling | None:
    """``required`` and a named function: the engine writes the calls as JSON fitting the tools' schema
    (structured outputs); ``auto``: free text read for <tool_call> blocks, stopped after the first call when
    parallel calls are off."""
    if request is None or not request.calls:
        return sampling
    base = sampling or Sampling()
    if base.response_format is not None:
        raise invalid("'response_format' cannot be combined with tools unless 'tool_choice' is 'none': the "
                      "reply is either the calls or the JSON you asked for.", "response_format")
    if request.guided:
        schema = orjson.dumps(request.schema()).decode()
        return msgspec.structs.replace(base, tool_call="json",
                                       response_format=ResponseFormat(type="json_schema", json_schema=schema))
    stop = base.stop if request.parallel else [*(base.stop or []), calls.CLOSE]
    return msgspec.structs.replace(base, tool_call="hermes", stop=stop)


def resolve_model(model: Any, models: Mapping[str, str], default_pool: str) -> str:
    """A pool name, or a served model name (its default pool if that serves it, else the first that does)."""
    if not isinstance(model, str) or not model:
        raise invalid("You must provide a model parameter.", "model")
    if model in models:
        return model
    serving = [pool for pool, served in models.items() if served == model]
    if serving:
        return default_pool if default_pool in serving else serving[0]
    raise _no_such_model(model, models)


def _no_such_model(model: str, models: Mapping[str, str]) -> CompatError:
    """OpenAI's 404, naming the valid ones."""
    names = ", ".join(dict.fromkeys([*models, *models.values()]))
    return CompatError(404, "model_not_found", f"The model `{model}` does not exist or you do not have access "
                                               f"to it. Choose one of: {names}.", "model")


def messages(raw: Any, max_message_chars: int, tool_request: tools.ToolRequest | None = None) -> list[ChatTurn]:
    if not isinstance(raw, list) or not raw:
        raise invalid("'messages' must be a non-empty array.", "messages")
    too_many("messages", raw)
    turns = [_turn(m, i) for i, m in enumerate(tools.flatten(raw, _text))]
    listed = tool_request.system_text() if tool_request is not None else None
    if listed is not None:  # after the client's own instructions
        at = next((i for i, t in enumerate(turns) if t.role != "system"), len(turns))
        turns.insert(at, ChatTurn("system", listed))
    last = turns[-1]
    if last.role != "user":
        raise invalid("The last message must be the user's: Parley answers a user message.", "messages")
    if not last.content.strip():
        raise invalid("The last user message is empty. Type something to send.", f"messages[{len(raw) - 1}]")
    if len(last.content) > max_message_chars:
        raise invalid(f"The last user message is {len(last.content):,} characters; the limit is "
                      f"{max_message_chars:,}. Shorten it or split it.", "messages", "context_length_exceeded")
    total, limit = sum(len(t.content) for t in turns), HISTORY_CHARS_FACTOR * max_message_chars
    if total > limit:
        raise invalid(f"The messages total {total:,} characters; the limit is {limit:,}. Send fewer or "
                      f"shorter earlier messages.", "messages", "context_length_exceeded")
    return turns


def too_many(field: str, items: Any) -> None:
    """400 for an array of more than ``MAX_MESSAGES`` messages, before any of them is read."""
    if isinstance(items, list) and len(items) > MAX_MESSAGES:
        raise invalid(f"'{field}' has {len(items):,} items; the limit is {MAX_MESSAGES:,}. Send fewer or "
                      f"merge earlier ones.", field, "array_above_max_length")


def _turn(message: Any, i: int) -> ChatTurn:
    where = f"messages[{i}]"
    if not isinstance(message, dict):
        raise invalid(f"{where} must be an object with 'role' and 'content'.", where)
    role = message.get("role")
    if role not in ROLES:
        raise invalid(f"{where}.role must be one of system, developer, user, assistant, tool; got {role!r}.",
                      f"{where}.role")
    if message.get("audio") is not None:
        raise invalid(f"{where}: audio is not supported.", f"{where}.audio", "unsupported_parameter")
    return ChatTurn(ROLES[role], _text(message.get("content"), f"{where}.content"))


def _text(content: Any, where: str) -> str:
    """A string, or an array of text parts (joined with newlines); images, audio and files are refused."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise invalid(f"{where} must be a string or an array of text parts.", where)
    texts = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind != "text" or not isinstance(part.get("text"), str):
            raise invalid(f"{where}[{j}]: only text content parts are supported (got {kind!r}); images, audio "
                          f"and files are not.", f"{where}[{j}]", "unsupported_content")
        texts.append(part["text"])
    return "\n".join(texts)


def _bool(value: Any, param: str) -> bool:
    if value is None or isinstance(value, bool):
        return bool(value)
    raise invalid(f"'{param}' must be true or false.", param)


def _max_tokens(body: dict[str, Any]) -> int | None:
    param = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
    return sampling_params.reply_cap(body, param)


def _include_usage(options: Any, stream: bool) -> bool:
    if options is None:
        return False
    if not stream:
        raise invalid("'stream_options' is only allowed when 'stream' is true.", "stream_options")
    if not isinstance(options, dict):
        raise invalid("'stream_options' must be an object.", "stream_options")
    return _bool(options.get("include_usage"), "stream_options.include_usage")


# -- out: completions, chunks, models -------------------------------------------------------------------
def completion_id(generation_id: str) -> str:
    return f"chatcmpl-{generation_id}"


def usage_json(usage: Usage) -> dict[str, Any]:
    return {"prompt_tokens": usage.prompt_tokens, "completion_tokens": usage.completion_tokens,
            "total_tokens": usage.prompt_tokens + usage.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": usage.cached_prompt_tokens}}


def total_usage(usages: list[Usage]) -> Usage:
    """n choices are n generations, each charged for its own prompt: the usage is their sum."""
    return Usage(prompt_tokens=sum(u.prompt_tokens for u in usages),
                 completion_tokens=sum(u.completion_tokens for u in usages),
                 cached_prompt_tokens=sum(u.cached_prompt_tokens for u in usages))


def logprobs_json(tokens: list[TokenLogprob] | None) -> dict[str, Any] | None:
    if tokens is None:
        return None
    return {"content": [{"token": t.token, "logprob": t.logprob, "bytes": list(t.token.encode()),
                         "top_logprobs": [{"token": a.token, "logprob": a.logprob, "bytes": list(a.token.encode())}
                                          for a in t.top]} for t in tokens], "refusal": None}


def completion(finished: list[GenerationFinished], logprobs: list[list[TokenLogprob] | None] | None = None,
               tool_request: tools.ToolRequest | None = None) -> dict[str, Any]:
    """The ``chat.completion`` object for replies (one per choice) that ended complete, stopped or at
    their length cap."""
    first = finished[0]
    logprobs = logprobs or [None] * len(finished)
    return {"id": completion_id(first.generation_id), "object": "chat.completion",
            "created": id_time_ms(first.generation_id) // 1000, "model": first.model,
            "system_fingerprint": None,
            "choices": [{"index": i, **_choice(f, tool_request), "logprobs": logprobs_json(lp)}
                        for i, (f, lp) in enumerate(zip(finished, logprobs, strict=True))],
            "usage": usage_json(total_usage([f.usage for f in finished]))}


def _choice(f: GenerationFinished, tool_request: tools.ToolRequest | None) -> dict[str, Any]:
    if tool_request is None or f.status == "blocked":  # a cut reply's text is the notice
        return {"message": {"role": "assistant", "content": f.text, "refusal": None},
                "finish_reason": FINISH_REASONS[f.status]}
    read = calls.read_whole(tool_request, f.generation_id, f.text)
    return {"message": calls.message(tool_request, read),
            "finish_reason": calls.finish_reason(tool_request, read, FINISH_REASONS[f.status])}


def chunk(generation_id: str, model: str, delta: dict[str, Any] | None, finish_reason: str | None = None,
          usage: Usage | None = None, include_usage: bool = False, index: int = 0,
          logprobs: list[TokenLogprob] | None = None) -> bytes:
    """One ``data:`` line; ``delta=None`` makes the usage-only chunk (no choices)."""
    body: dict[str, Any] = {"id": completion_id(generation_id), "object": "chat.completion.chunk",
                            "created": id_time_ms(generation_id) // 1000, "model": model,
                            "system_fingerprint": None}
    body["choices"] = [] if delta is None else [
        {"index": index, "delta": delta, "logprobs": logprobs_json(logprobs), "finish_reason": finish_reason}]
    if include_usage:
        body["usage"] = usage_json(usage) if usage is not None else None
    return sse_data(body)


def model_object(model_id: str, models: Mapping[str, str], default_pool: str) -> dict[str, Any]:
    """``models.retrieve``: a pool or a served model name, else OpenAI's 404."""
    found = next((m for m in model_list(models, default_pool) if m["id"] == model_id), None)
    if found is None:  # every name resolve_model accepts is listed
        raise _no_such_model(model_id, models)
    return found


def sse_data(body: Any) -> bytes:
    return b"data: " + orjson.dumps(body) + b"\n\n"


def model_list(models: Mapping[str, str], default_pool: str) -> list[dict[str, Any]]:
    """One entry per pool, then one per served model name not already a pool (it means the default pool)."""
    data = [{"id": pool, "object": "model", "created": STARTED, "owned_by": "parley", "served_model_name": served}
            for pool, served in models.items()]
    for served in dict.fromkeys(models.values()):
        if served not in models:
            pool = resolve_model(served, models, default_pool)
            data.append({"id": served, "object": "model", "created": STARTED, "owned_by": "parley",
                         "served_model_name": served, "pool": pool})
    return data


# -- errors ----------------------------------------------------------------------------------------------
def applies(path: str) -> bool:
    return path.rstrip("/") in OPENAI_PATHS or path.startswith(OPENAI_PREFIXES)


def unknown_route(method: str, path: str, status: int) -> dict[str, Any]:
    """OpenAI's answer to a path or method it does not serve (its clients show ``message``)."""
    if status == 405:
        return _error(f"Method {method} is not allowed on {path}.", "invalid_request_error", None,
                      "method_not_allowed")
    return _error(f"Invalid URL ({method} {path})", "invalid_request_error", None, "unknown_url")


def error_response(path: str, err: ApiError) -> JSONResponse:
    """The native error shape, or OpenAI's on the OpenAI-compatible paths (its clients parse that)."""
    if applies(path):
        status, body = error_json(err)
        return JSONResponse(body, status_code=status, headers=err.headers())
    return JSONResponse(err.body(), status_code=err.status, headers=err.headers())


def error_json(err: ApiError) -> tuple[int, dict[str, Any]]:
    """(status, body) in OpenAI's shape for any gateway error."""
    if isinstance(err, CompatError):
        return err.status, _error(err.message, err.type, err.param, err.code or None)
    if err.status == 401:
        return 401, _error(err.message, "invalid_request_error", None, "invalid_api_key")
    if err.status == 413 and err.code == "request_too_large":
        return 413, _error(err.message, "invalid_request_error", "messages", "request_too_large")
    if err.status == 413:
        return 400, _error(err.message, "invalid_request_error", "messages", "context_length_exceeded")
    if err.status == 429:
        if err.code == "daily_budget":
            return 429, _error(err.message, "insufficient_quota", None, "insufficient_quota")
        return 429, _error(err.message, "tokens" if err.code == "rate_limit" else "requests", None,
                           "rate_limit_exceeded")
    if err.status >= 500:
        return err.status, _error(err.message, "server_error", None, err.code)
    code = "content_filter" if err.code == "blocked" else err.code  # the input check refused the message
    return 400 if err.status == 422 else err.status, _error(err.message, "invalid_request_error", None, code)


def _error(message: str, type_: str, param: str | None, code: str | None) -> dict[str, Any]:
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}
