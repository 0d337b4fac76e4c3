"""Function tools on the Responses API, with no I/O: its ``tools`` / ``tool_choice`` and its
``function_call`` / ``function_call_output`` input items in Chat Completions terms (``tools``), and a reply
read for calls (``tool_calls``) as ``function_call`` output items and their stream events."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

from producers.gateway import tool_calls as calls
from producers.gateway import tools
from producers.gateway.sampling_params import CompatError, invalid

ITEM_TYPES = frozenset({"function_call", "function_call_output"})


def parse(body: dict[str, Any]) -> tuple[tools.ToolRequest | None, dict[str, Any]]:
    """(the tool request, the fields every response object repeats: tools, tool_choice, parallel_tool_calls)."""
    raw, choice = body.get("tools"), body.get("tool_choice")
    parallel = body.get("parallel_tool_calls")
    if raw in (None, []) and choice in (None, "none", "auto"):
        return None, {}
    chat = {"tools": [_chat_tool(t) for t in raw] if isinstance(raw, list) else raw,
            "tool_choice": _chat_choice(choice), "parallel_tool_calls": parallel}
    try:
        request = tools.parse(chat)
    except CompatError as exc:  # the chat checks name tools[i].function.x; here it is tools[i].x
        param = exc.param.replace(".function", "") if exc.param else exc.param
        raise CompatError(exc.status, exc.code, exc.message, param) from exc
    return request, {"tools": raw or [], "tool_choice": choice if choice is not None else "auto",
                     "parallel_tool_calls": parallel is not False}


def request_of(echo: dict[str, Any]) -> tools.ToolRequest | None:
    """A stored response's tool request, from what it echoes (None: it reads no calls)."""
    if not echo.get("tools"):
        return None
    request, _ = parse({k: echo.get(k) for k in ("tools", "tool_choice", "parallel_tool_calls")})
    return request if request is not None and request.calls else None


def _chat_tool(raw: Any) -> Any:
    if not isinstance(raw, dict) or raw.get("type") != "function":
        return raw  # refused by tools.parse, naming its type
    function = {k: raw[k] for k in ("name", "description", "parameters", "strict") if k in raw}
    return {"type": "function", "function": function}


def _chat_choice(raw: Any) -> Any:
    if isinstance(raw, dict) and raw.get("type") == "function":
        return {"type": "function", "function": {"name": raw.get("name")}}
    if isinstance(raw, dict) and raw.get("type") == "allowed_tools":
        listed = raw.get("tools")
        return {"type": "allowed_tools", "mode": raw.get("mode"), "tools": [
            {"type": "function", "function": {"name": t.get("name")}} if isinstance(t, dict) else t
            for t in listed] if isinstance(listed, list) else listed}
    return raw


def input_items(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``function_call`` items join the assistant message before them (or make one); a
    ``function_call_output`` is a ``tool`` message."""
    out: list[dict[str, Any]] = []
    for i, item in enumerate(items):
        kind = item.get("type")
        if kind == "function_call":
            call = {"id": item.get("call_id"), "type": "function",
                    "function": {"name": item.get("name"), "arguments": item.get("arguments")}}
            last = out[-1] if out else None
            if last is not None and last.get("role") == "assistant":
                out[-1] = {**last, "tool_calls": [*(last.get("tool_calls") or []), call]}
            else:
                out.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            output = item.get("output")
            if not isinstance(output, (str, list)):
                raise invalid(f"input[{i}].output must be a string.", f"input[{i}].output")
            out.append({"role": "tool", "tool_call_id": item.get("call_id"), "content": output})
        else:
            out.append(item)
    return out


def prior_message(request: tools.ToolRequest, generation_id: str, text: str) -> dict[str, Any] | None:
    """The previous response's reply as an assistant message with its calls (None if it made none), so
    ``function_call_output`` items can answer them."""
    read = calls.read_whole(request, generation_id, text)
    if not read.calls:
        return None
    return {"role": "assistant", "content": read.content or None, "tool_calls": [
        {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
        for c in read.calls]}


def call_item(generation_id: str, call: calls.Call, done: bool) -> dict[str, Any]:
    return {"id": f"fc_{call.id.removeprefix('call_')}", "type": "function_call", "call_id": call.id,
            "name": call.name, "arguments": call.arguments if done else "",
            "status": "completed" if done else "in_progress"}


def output(request: tools.ToolRequest, generation_id: str, text: str,
           message: Callable[[str], dict[str, Any]]) -> list[dict[str, Any]]:
    """A reply's output items: its text as a message (if any), then one ``function_call`` per call."""
    read = calls.read_whole(request, generation_id, text)
    items = [message(read.content)] if read.content or not read.calls else []
    return items + [call_item(generation_id, c, True) for c in read.calls]


class ToolEvents:
    """The stream events of a reply read for calls, in the order its text arrives: the message's text
    (opened on its first character), each call's item, its argument deltas, and at the end every
    ``.done``. ``numbered`` gives each event its sequence number."""

    def __init__(self, request: tools.ToolRequest, generation_id: str,
                 numbered: Callable[[dict[str, Any]], dict[str, Any]],
                 message: Callable[[str, str], dict[str, Any]], part: Callable[[str], dict[str, Any]]) -> None:
        self.reader = calls.reader(request, generation_id)
        self.gid, self.numbered, self.message, self.part = generation_id, numbered, message, part
        self.indexes: dict[str, int] = {}  # "msg" or a call's index -> its output_index

    def feed(self, text: str) -> list[dict[str, Any]]:
        return self._shown(self.reader.feed(text))

    def close(self) -> list[dict[str, Any]]:
        out = self._shown(self.reader.close())
        if "msg" in self.indexes:
            text, where = self.reader.content, self._where("msg")
            out += [self.numbered({"type": "response.output_text.done", **where, "text": text, "logprobs": []}),
                    self.numbered({"type": "response.content_part.done", **where, "part": self.part(text)}),
                    self.numbered({"type": "response.output_item.done", "output_index": self.indexes["msg"],
                                   "item": self.message(text, "completed")})]
        for i, call in enumerate(self.reader.calls):
            index, item = self.indexes[str(i)], call_item(self.gid, call, True)
            out += [self.numbered({"type": "response.function_call_arguments.done", "item_id": item["id"],
                                   "output_index": index, "name": call.name, "arguments": call.arguments}),
                    self.numbered({"type": "response.output_item.done", "output_index": index, "item": item})]
        return out

    def _shown(self, deltas: list[calls.Delta]) -> list[dict[str, Any]]:
        out = []
        for d in deltas:
            if d.kind == "content":
                if "msg" not in self.indexes:
                    self.indexes["msg"] = len(self.indexes)
                    out += [self.numbered({"type": "response.output_item.added", "output_index": self.indexes["msg"],
                                           "item": self.message("", "in_progress")}),
                            self.numbered({"type": "response.content_part.added", **self._where("msg"),
                                           "part": self.part("")})]
                out.append(self.numbered({"type": "response.output_text.delta", **self._where("msg"),
                                          "delta": d.text, "logprobs": []}))
            elif d.kind == "start":
                self.indexes[str(d.index)] = len(self.indexes)
                out.append(self.numbered({"type": "response.output_item.added", "output_index": len(self.indexes) - 1,
                                          "item": call_item(self.gid, self.reader.calls[d.index], False)}))
            else:
                item_id = call_item(self.gid, self.reader.calls[d.index], False)["id"]
                out.append(self.numbered({"type": "response.function_call_arguments.delta", "item_id": item_id,
                                          "output_index": self.indexes[str(d.index)], "delta": d.text}))
        return out

    def _where(self, key: str) -> dict[str, Any]:
        return {"item_id": f"msg_{self.gid}", "output_index": self.indexes[key], "content_index": 0}
