"""Function calling on the OpenAI API, the reply side, with no I/O: the reply's text -> ``tool_calls``,
as it streams in pieces of any size (a ``chat.tokens`` record carries several tokens) or whole.

``reader(request, call_id)`` picks how a reply holds its calls:
- ``named``: the whole reply is the function's arguments (guided JSON); each piece is an arguments fragment.
- ``required``: a JSON array ``[{"name": ..., "arguments": {...}}, ...]`` (guided JSON); a call opens when its
  name is read, and the characters of its arguments object stream as fragments, so the fragments of one call
  join to exactly its arguments' JSON text.
- ``auto``: free text with Hermes ``<tool_call>{"name": ..., "arguments": ...}</tool_call>`` blocks; text outside
  them is content (a piece that might begin a tag is held back until it is known), each block becomes one call
  once it closes and parses (or the reply ends inside it), with its arguments in one fragment. A block that
  does not parse, or names no tool of the request, is shown as content.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any

import orjson

from producers.gateway.tools import ToolRequest

OPEN, CLOSE = "<tool_call>", "</tool_call>"


@dataclass
class Call:
    id: str
    name: str
    arguments: str = ""


@dataclass(frozen=True)
class Delta:
    """``kind``: "content" (``text``), "start" (call ``index`` named ``text``) or "args" (a fragment)."""

    kind: str
    text: str
    index: int = 0


def call_id(generation_id: str, index: int) -> str:
    return "call_" + hashlib.sha256(f"{generation_id}:{index}".encode()).hexdigest()[:24]


@dataclass
class Reader:
    request: ToolRequest
    generation_id: str
    calls: list[Call] = field(default_factory=list)
    content: str = ""

    def feed(self, text: str) -> list[Delta]:
        raise NotImplementedError

    def close(self) -> list[Delta]:
        return []

    def _start(self, name: str) -> Delta:
        self.calls.append(Call(call_id(self.generation_id, len(self.calls)), name))
        return Delta("start", name, len(self.calls) - 1)

    def _args(self, fragment: str) -> Delta:
        self.calls[-1].arguments += fragment
        return Delta("args", fragment, len(self.calls) - 1)

    def _content(self, text: str) -> list[Delta]:
        self.content += text
        return [Delta("content", text)] if text else []


class NamedReader(Reader):
    def feed(self, text: str) -> list[Delta]:
        out = [] if self.calls else [self._start(self.request.named or "")]
        return out + ([self._args(text)] if text else [])

    def close(self) -> list[Delta]:
        return [] if self.calls else [self._start(self.request.named or "")]


@dataclass
class ArrayReader(Reader):
    """A character scanner over the guided array: depth 1 is the array, 2 a call object, 3+ its arguments."""

    depth: int = 0
    in_string: bool = False
    escaped: bool = False
    string: str = ""
    key: str = ""
    expecting_value: bool = False
    in_args: bool = False
    name: str | None = None
    held: str = ""  # arguments read before the call's name (not in the schema's order)

    def feed(self, text: str) -> list[Delta]:
        out: list[Delta] = []
        fragment = ""
        for ch in text:
            if self.in_args:
                fragment += ch
                self._scan(ch)
                if self.depth == 2 and not self.in_string:  # the arguments object closed
                    self.in_args, self.expecting_value = False, False
                continue
            if fragment:
                out += self._fragment(fragment)
                fragment = ""
            out += self._outside(ch)
        if fragment:
            out += self._fragment(fragment)
        return out

    def _fragment(self, fragment: str) -> list[Delta]:
        if self.name is None:
            self.held += fragment
            return []
        return [self._args(fragment)]

    def _scan(self, ch: str) -> None:
        if self.in_string:
            if self.escaped:
                self.escaped = False
            elif ch == "\\":
                self.escaped = True
            elif ch == '"':
                self.in_string = False
        elif ch == '"':
            self.in_string = True
        elif ch in "{[":
            self.depth += 1
        elif ch in "}]":
            self.depth -= 1

    def _outside(self, ch: str) -> list[Delta]:
        was_string, depth = self.in_string, self.depth
        if self.in_string and depth == 2 and (self.escaped or ch != '"'):
            self.string += ch  # raw, escapes and all: read as JSON when it ends
        self._scan(ch)
        if depth != 2:
            if depth == 1 and self.depth == 2:  # a call object opens
                self.name, self.held, self.key, self.expecting_value = None, "", "", False
            return []
        if was_string and not self.in_string:  # a string at the call's level ended
            value, self.string = _unescape(self.string), ""
            if not self.expecting_value:
                self.key = value
            elif self.key == "name" and self.name is None:
                self.name = value
                out = [self._start(value)]
                if self.held:
                    out.append(self._args(self.held))
                    self.held = ""
                return out
            return []
        if self.in_string or ch.isspace():
            return []
        if ch == ":":
            self.expecting_value = True
        elif ch == ",":
            self.expecting_value = False
        elif self.expecting_value and self.key == "arguments" and self.depth == 3:
            self.in_args = True  # this "{" opened the arguments
            return self._fragment(ch)
        return []


def _unescape(raw: str) -> str:
    try:
        return str(orjson.loads(f'"{raw}"'))
    except orjson.JSONDecodeError:
        return raw


class HermesReader(Reader):
    def __init__(self, request: ToolRequest, generation_id: str) -> None:
        super().__init__(request, generation_id)
        self.pending = ""  # text not yet shown: a possible tag start, or an open block
        self.inside = False

    def feed(self, text: str) -> list[Delta]:
        self.pending += text
        out: list[Delta] = []
        while True:
            if self.inside:
                end = self.pending.find(CLOSE)
                if end < 0:
                    return out
                body, self.pending, self.inside = self.pending[:end], self.pending[end + len(CLOSE):], False
                out += self._block(body, closed=True)
                continue
            start = self.pending.find(OPEN)
            if start >= 0:
                out += self._text(self.pending[:start])
                self.pending, self.inside = self.pending[start + len(OPEN):], True
                continue
            keep = _tag_prefix(self.pending)
            out += self._text(self.pending[:len(self.pending) - keep])
            self.pending = self.pending[len(self.pending) - keep:]
            return out

    def close(self) -> list[Delta]:
        rest, self.pending = self.pending, ""
        if self.inside:  # the reply ended in a block (a stop at its closing tag, or the length cap)
            self.inside = False
            return self._block(rest, closed=False)
        return self._text(rest)

    def _text(self, text: str) -> list[Delta]:
        if self.calls and not text.strip():
            return []  # the space between and after calls
        return self._content(text)

    def _block(self, body: str, closed: bool) -> list[Delta]:
        parsed = _call_of(body, self.request.names)
        if parsed is None or (self.calls and not self.request.parallel):
            if parsed is not None:
                return []  # a second call when parallel calls are off: not made
            return self._content(OPEN + body + (CLOSE if closed else ""))
        name, arguments = parsed
        return [self._start(name), self._args(arguments)]


def _call_of(body: str, names: frozenset[str]) -> tuple[str, str] | None:
    try:
        value = orjson.loads(body.strip())
    except orjson.JSONDecodeError:
        return None
    if not isinstance(value, dict) or value.get("name") not in names:
        return None
    arguments = value.get("arguments", value.get("parameters", {}))
    if isinstance(arguments, str):
        try:
            arguments = orjson.loads(arguments)
        except orjson.JSONDecodeError:
            return None
    if not isinstance(arguments, dict):
        return None
    return str(value["name"]), orjson.dumps(arguments).decode()


def _tag_prefix(text: str) -> int:
    """How many characters at the end of ``text`` could begin ``<tool_call>``."""
    for n in range(min(len(OPEN) - 1, len(text)), 0, -1):
        if OPEN.startswith(text[-n:]):
            return n
    return 0


def reader(request: ToolRequest, generation_id: str) -> Reader:
    if request.choice == "named":
        return NamedReader(request, generation_id)
    if request.choice == "required":
        return ArrayReader(request, generation_id)
    return HermesReader(request, generation_id)


def read_whole(request: ToolRequest, generation_id: str, text: str) -> Reader:
    r = reader(request, generation_id)
    r.feed(text)
    r.close()
    return r


# -- OpenAI's shapes ------------------------------------------------------------------------------------
def message(request: ToolRequest, r: Reader) -> dict[str, Any]:
    """The assistant ``message`` of a reply read for calls."""
    content = r.content or None
    if request.legacy:
        first = r.calls[0] if r.calls else None
        call = {"name": first.name, "arguments": first.arguments} if first else None
        return {"role": "assistant", "content": content, "refusal": None, "function_call": call}
    calls = [{"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
             for c in r.calls]
    return {"role": "assistant", "content": content, "refusal": None, "tool_calls": calls or None}


def delta_json(request: ToolRequest, r: Reader, d: Delta) -> dict[str, Any] | None:
    """One streamed delta; None for what a legacy stream does not show (calls after its first)."""
    if d.kind == "content":
        return {"content": d.text}
    if request.legacy:
        if d.index > 0:
            return None
        return {"function_call": {"name": d.text, "arguments": ""}} if d.kind == "start" else \
            {"function_call": {"arguments": d.text}}
    if d.kind == "start":
        return {"tool_calls": [{"index": d.index, "id": r.calls[d.index].id, "type": "function",
                                "function": {"name": d.text, "arguments": ""}}]}
    return {"tool_calls": [{"index": d.index, "function": {"arguments": d.text}}]}


def finish_reason(request: ToolRequest, r: Reader, reason: str) -> str:
    """``tool_calls`` (``function_call`` for the legacy form) when the reply called a function and ended by
    itself; a reply cut at its length cap stays ``length``."""
    if r.calls and reason == "stop":
        return "function_call" if request.legacy else "tool_calls"
    return reason
