"""The OpenAI Responses dialect, with no I/O: a request body -> ``ResponseRequest`` (or a 400 naming
the unsupported field), and Parley's token events -> response objects and stream events.

A response is one generation: ``resp_<generation_id>``. Its stream events are a pure function of
the generation's events in ``chat.tokens`` (each token batch once, by its ``seq``), so every
gateway that replays the buffer numbers them the same: ``starting_after=N`` resumes anywhere.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from producers.gateway import openai_compat as compat
from producers.gateway import responses_tools as rtools
from producers.gateway import sampling_params, tools
from producers.gateway.sampling_params import CompatError, invalid
from schemas import GenerationFinished, GenerationStarted, RequestRefused, TokensAppended, Usage, id_time_ms
from schemas.gateway import ChatTurn
from schemas.sampling import Sampling

PREFIX = "resp_"
ACCEPTED = frozenset({"model", "input", "instructions", "previous_response_id", "store", "stream", "background",
                      "max_output_tokens", "temperature", "top_p", "metadata", "user", "text", "truncation",
                      "parallel_tool_calls", "service_tier", "safety_identifier", "prompt_cache_key",
                      "top_logprobs", "stream_options", "tools", "tool_choice"})
# Accepted only at the value that means "not used" (what the SDKs send by default).
UNUSED: dict[str, tuple[Any, ...]] = {"include": (None, []), "reasoning": (None, {}), "max_tool_calls": (None,)}
STATUS = {"complete": "completed", "length": "incomplete", "stopped": "cancelled", "failed": "failed",
          "blocked": "incomplete"}  # the output check cut the reply: its text is the notice
INCOMPLETE = {"length": "max_output_tokens", "blocked": "content_filter"}
END_EVENT = {"completed": "response.completed", "incomplete": "response.incomplete",
             "cancelled": "response.incomplete", "failed": "response.failed"}


@dataclass(frozen=True)
class ResponseRequest:
    pool: str
    input: list[ChatTurn]  # the last one is the user's
    instructions: str | None
    previous_response_id: str | None
    store: bool
    stream: bool
    background: bool
    max_output_tokens: int | None
    temperature: float | None
    sampling: Sampling | None
    metadata: dict[str, str] = field(default_factory=dict)
    tool_echo: dict[str, Any] = field(default_factory=dict)  # tools, tool_choice, parallel_tool_calls as sent
    tools: tools.ToolRequest | None = None

    def echo(self) -> dict[str, Any]:
        """The request fields every response object repeats (kept with the response in Redis)."""
        return {"instructions": self.instructions, "previous_response_id": self.previous_response_id,
                "store": self.store, "background": self.background, "max_output_tokens": self.max_output_tokens,
                "temperature": self.temperature, "top_p": self.sampling.top_p if self.sampling else None,
                "metadata": self.metadata, **self.tool_echo}


def response_id(generation_id: str) -> str:
    return PREFIX + generation_id


def generation_of(rid: str) -> str | None:
    return rid[len(PREFIX):] if rid.startswith(PREFIX) and len(rid) > len(PREFIX) else None


def parse(body: Any, models: Mapping[str, str], default_pool: str, max_message_chars: int,
          prior: list[dict[str, Any]] | None = None) -> ResponseRequest:
    """``prior``: the previous response's calls, as an assistant message, when ``input`` answers them."""
    if not isinstance(body, dict):
        raise invalid("The request body must be a JSON object.")
    for name, unused in UNUSED.items():
        if body.get(name) not in unused:
            raise invalid(f"'{name}' is not supported: Parley has no tools, reasoning or extra outputs.", name,
                          "unsupported_parameter")
    unknown = sorted(set(body) - ACCEPTED - UNUSED.keys())
    if unknown:
        raise invalid(f"Unsupported parameter(s): {', '.join(unknown)}.", unknown[0], "unsupported_parameter")
    pool = compat.resolve_model(body.get("model"), models, default_pool)
    instructions = body.get("instructions")
    if instructions is not None and not isinstance(instructions, str):
        raise invalid("'instructions' must be a string.", "instructions")
    tool_request, tool_echo = rtools.parse(body)
    try:
        turns = compat.messages([*(prior or []), *rtools.input_items(_input(body.get("input")))], max_message_chars,
                                tool_request)
    except CompatError as exc:  # the chat checks name "messages"; here the field is "input"
        param = exc.param.replace("messages", "input", 1) if exc.param else exc.param
        raise CompatError(exc.status, exc.code, exc.message.replace("messages", "input"), param) from exc
    store, background = _flag(body, "store", True), _flag(body, "background", False)
    if background and not store:
        raise invalid("'background' needs 'store': a background response is kept so it can be fetched.",
                      "background")
    previous = body.get("previous_response_id")
    if previous is not None and (not isinstance(previous, str) or generation_of(previous) is None):
        raise invalid("'previous_response_id' must be an id this API returned (resp_...).", "previous_response_id")
    max_output = sampling_params.reply_cap(body, "max_output_tokens")
    fields = {k: body[k] for k in ("temperature", "top_p") if k in body}
    if body.get("top_logprobs"):
        fields.update(logprobs=True, top_logprobs=body["top_logprobs"])
    fields["response_format"] = _format(body.get("text"))
    try:
        sampled = sampling_params.openai_defaults(sampling_params.parse(fields, max_output))
    except CompatError as exc:  # the chat checks name "response_format"; here the field is "text.format"
        raise CompatError(exc.status, exc.code, exc.message.replace("response_format.json_schema.", "text.format."),
                          _format_param(exc.param)) from exc
    metadata = body.get("metadata") or {}
    if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
        raise invalid("'metadata' must be an object of strings.", "metadata")
    return ResponseRequest(pool, turns, instructions, previous, store, _flag(body, "stream", False), background,
                           max_output, sampled.temperature, compat.with_tools(sampled.sampling, tool_request),
                           metadata, tool_echo, tool_request if tool_request is not None and tool_request.calls
                           else None)


def _input(raw: Any) -> list[dict[str, Any]]:
    """``input`` as text, or message items (``type`` message or absent) with text content parts."""
    if isinstance(raw, str):
        return [{"role": "user", "content": raw}]
    if not isinstance(raw, list) or not raw:
        raise invalid("'input' must be a string or a non-empty array of message items.", "input")
    compat.too_many("input", raw)
    out = []
    for i, item in enumerate(raw):
        if isinstance(item, dict) and item.get("type") in rtools.ITEM_TYPES:
            out.append(item)  # read by responses_tools.input_items
            continue
        if not isinstance(item, dict) or item.get("type", "message") != "message":
            kind = item.get("type") if isinstance(item, dict) else type(item).__name__
            raise invalid(f"input[{i}]: only message items are supported (got {kind!r}).", f"input[{i}]",
                          "unsupported_parameter")
        content = item.get("content")
        if isinstance(content, list):
            content = [dict(p, type="text") if isinstance(p, dict) and p.get("type") in ("input_text", "output_text")
                       else p for p in content]
        out.append({"role": item.get("role"), "content": content})
    return out


def _format(text: Any) -> dict[str, Any] | None:
    """``text.format`` -> the Chat Completions ``response_format`` it means."""
    fmt = text.get("format") if isinstance(text, dict) else None
    if fmt is None:
        return None
    if isinstance(fmt, dict) and fmt.get("type") == "json_schema":
        return {"type": "json_schema", "json_schema": {"schema": fmt.get("schema")}}
    return fmt


def _format_param(param: str | None) -> str | None:
    if param is None or not param.startswith("response_format"):
        return param
    return "text.format" + param.removeprefix("response_format").removeprefix(".json_schema")


def _flag(body: Mapping[str, Any], name: str, default: bool) -> bool:
    value = body.get(name, default)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise invalid(f"'{name}' must be true or false.", name)
    return value


# -- out ---------------------------------------------------------------------------------------------------
@dataclass
class State:
    """What a generation's events say so far (each token batch counted once, by seq)."""

    generation_id: str
    model: str
    status: str = "queued"
    text: str = ""
    seqs: set[int] = field(default_factory=set)
    usage: Usage | None = None
    error: dict[str, str] | None = None
    reason: str = ""  # Parley's own status once finished

    def feed(self, event: Any) -> str | None:
        """Fold one event in; returns the new text it carried (None if it carried none)."""
        if isinstance(event, GenerationStarted):
            self.model, self.status = event.model, "in_progress"
        elif isinstance(event, TokensAppended) and event.seq not in self.seqs:
            self.seqs.add(event.seq)
            self.status = "in_progress"
            if event.text:
                self.text += event.text
                return event.text
        elif isinstance(event, GenerationFinished):
            rest = event.text[len(self.text):] if event.text.startswith(self.text) else ""
            self.text, self.model, self.usage = event.text, event.model, event.usage
            self.status, self.reason = STATUS[event.status], event.status
            if event.status == "failed":
                self.error = {"code": "server_error", "message": event.reason or "The model failed to answer."}
            return rest or None
        elif isinstance(event, RequestRefused):
            self.status, self.error = "failed", {"code": event.reason, "message": event.message}
        elif getattr(event, "model", None):
            self.model = event.model
        return None

    @property
    def done(self) -> bool:
        return self.status in ("completed", "incomplete", "cancelled", "failed")


def message_item(state: State, text: str | None = None, status: str | None = None) -> dict[str, Any]:
    content = [] if text is None else [_part(text)]
    return {"id": f"msg_{state.generation_id}", "type": "message", "role": "assistant", "content": content,
            "status": status or ("completed" if state.done and state.status == "completed" else
                                 "incomplete" if state.done else "in_progress")}


def _part(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def response_object(state: State, echo: Mapping[str, Any]) -> dict[str, Any]:
    usage = state.usage
    started = state.status != "queued" or bool(state.text)
    return {
        "id": response_id(state.generation_id), "object": "response",
        "created_at": id_time_ms(state.generation_id) // 1000, "status": state.status, "model": state.model,
        "error": state.error, "incomplete_details": {"reason": INCOMPLETE.get(state.reason, "max_output_tokens")}
        if state.status == "incomplete" else None,
        "output": _output(state, echo) if started or state.done else [],
        "usage": None if usage is None else {
            "input_tokens": usage.prompt_tokens, "output_tokens": usage.completion_tokens,
            "total_tokens": usage.prompt_tokens + usage.completion_tokens,
            "input_tokens_details": {"cached_tokens": usage.cached_prompt_tokens},
            "output_tokens_details": {"reasoning_tokens": 0}},
        "parallel_tool_calls": False, "tool_choice": "none", "tools": [], "truncation": "auto",
        "text": {"format": {"type": "text"}}, **echo}


def _output(state: State, echo: Mapping[str, Any]) -> list[dict[str, Any]]:
    request = rtools.request_of(dict(echo))
    if request is None or state.reason == "blocked":  # a cut reply's text is the notice
        return [message_item(state, state.text)]
    return rtools.output(request, state.generation_id, state.text, lambda text: message_item(state, text))


class EventStream:
    """A response's stream events, numbered from 0; the same events in give the same numbers out."""

    def __init__(self, state: State, echo: Mapping[str, Any]) -> None:
        self.state, self.echo, self.seq, self.opened = state, echo, -1, False
        request = rtools.request_of(dict(echo))
        self.calls = None if request is None else rtools.ToolEvents(
            request, state.generation_id, self._numbered,
            lambda text, status: message_item(self.state, text or None, status), _part)

    def start(self) -> list[dict[str, Any]]:
        return [self._event("response.created"), self._event("response.in_progress")]

    def feed(self, event: Any) -> list[dict[str, Any]]:
        was_done = self.state.done
        new_text = self.state.feed(event)
        out: list[dict[str, Any]] = []
        if was_done:
            return out
        if self.calls is not None:
            out = self.calls.feed(new_text) if new_text else []
            return out + (self.calls.close() + [self._event(END_EVENT[self.state.status])] if self.state.done else [])
        if isinstance(event, GenerationStarted) or new_text or self.state.done:
            out += self._open()
        if new_text:
            out.append(self._delta(new_text))
        if self.state.done:
            out += self._close()
        return out

    def saved(self, text: str, status: str, model: str, usage: Usage) -> list[dict[str, Any]]:
        """The buffer aged out: the saved reply, whole, as one delta."""
        self.state.model, self.state.text = model, text
        if self.calls is not None:
            out = self.calls.feed(text)
            self.state.status, self.state.usage = status, usage
            return out + self.calls.close() + [self._event(END_EVENT[self.state.status])]
        out = [*self._open(), self._delta(text)] if text else self._open()
        self.state.status, self.state.usage = status, usage
        return out + self._close()

    def _open(self) -> list[dict[str, Any]]:
        if self.opened:
            return []
        self.opened = True
        return [self._numbered({"type": "response.output_item.added", "output_index": 0,
                                "item": message_item(self.state, status="in_progress")}),
                self._numbered({"type": "response.content_part.added", **self._where(), "part": _part("")})]

    def _delta(self, text: str) -> dict[str, Any]:
        return self._numbered({"type": "response.output_text.delta", **self._where(), "delta": text, "logprobs": []})

    def _close(self) -> list[dict[str, Any]]:
        text = self.state.text
        return [self._numbered({"type": "response.output_text.done", **self._where(), "text": text, "logprobs": []}),
                self._numbered({"type": "response.content_part.done", **self._where(), "part": _part(text)}),
                self._numbered({"type": "response.output_item.done", "output_index": 0,
                                "item": message_item(self.state, text)}),
                self._event(END_EVENT[self.state.status])]

    def _where(self) -> dict[str, Any]:
        return {"item_id": f"msg_{self.state.generation_id}", "output_index": 0, "content_index": 0}

    def _event(self, kind: str) -> dict[str, Any]:
        return self._numbered({"type": kind, "response": response_object(self.state, self.echo)})

    def _numbered(self, event: dict[str, Any]) -> dict[str, Any]:
        self.seq += 1
        return {**event, "sequence_number": self.seq}


def sse(event: dict[str, Any]) -> bytes:
    return f"event: {event['type']}\n".encode() + compat.sse_data(event)
