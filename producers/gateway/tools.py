"""Function calling on the OpenAI API, the request side, with no I/O: ``tools`` / ``tool_choice`` /
``parallel_tool_calls`` (and the legacy ``functions`` / ``function_call``) -> ``ToolRequest``; a history's
assistant ``tool_calls`` and ``tool`` results -> plain turns; the guided-JSON schema that makes ``required``
and a named ``tool_choice`` hold on any vLLM pool.

Tools reach the model as text in the Hermes format (Qwen2.5's and Hermes 3's chat templates write the same):
the definitions in a system turn inside ``<tools></tools>``, each earlier call as
``<tool_call>{"name": ..., "arguments": ...}</tool_call>`` in the assistant's turn, each result as
``<tool_response>...</tool_response>`` in a user turn. SmolLM2's template has no tool syntax of its own, so
the prompt is the same text whichever template renders it. The reply side is ``tool_calls``.
"""
from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import jsonschema
import orjson

from producers.gateway import schema_bounds
from producers.gateway.sampling_params import MAX_SCHEMA_CHARS, invalid

NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
MAX_TOOLS = 128  # OpenAI's limit
MODES = ("none", "auto", "required", "named")  # what a pool declares (GET /v1/models/{id})
EMPTY_PARAMETERS: dict[str, Any] = {"type": "object", "properties": {}}
CALL_FORMAT = ('For each function call, return a json object with function name and arguments within '
               '<tool_call></tool_call> XML tags:\n<tool_call>\n{"name": <function-name>, "arguments": '
               '<args-json-object>}\n</tool_call>')


@dataclass(frozen=True)
class Tool:
    name: str
    description: str
    parameters: dict[str, Any]
    strict: bool = False

    def definition(self) -> dict[str, Any]:
        function: dict[str, Any] = {"name": self.name}
        if self.description:
            function["description"] = self.description
        function["parameters"] = self.parameters
        return {"type": "function", "function": function}


@dataclass(frozen=True)
class ToolRequest:
    tools: tuple[Tool, ...]
    choice: str  # none, auto, required or named
    named: str | None = None  # the function a named tool_choice forces
    parallel: bool = True
    legacy: bool = False  # asked with functions/function_call: answered with message.function_call
    names: frozenset[str] = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "names", frozenset(t.name for t in self.tools))

    @property
    def calls(self) -> bool:
        """The reply is read for calls (``none`` never calls)."""
        return self.choice != "none"

    @property
    def guided(self) -> bool:
        """The engine writes the calls as JSON that fits ``schema()`` (structured outputs)."""
        return self.choice in ("required", "named")

    def schema(self) -> dict[str, Any]:
        """``named``: the function's arguments object. ``required``: an array of calls, one at most when
        ``parallel`` is off, each ``{"name", "arguments"}`` (name first, so a stream names a call before
        its arguments)."""
        if self.choice == "named":
            return next(t.parameters for t in self.tools if t.name == self.named)
        items = [{"type": "object", "properties": {"name": {"type": "string", "enum": [t.name]},
                                                    "arguments": t.parameters},
                  "required": ["name", "arguments"], "additionalProperties": False} for t in self.tools]
        schema: dict[str, Any] = {"type": "array", "minItems": 1,
                                  "items": items[0] if len(items) == 1 else {"anyOf": items}}
        if not self.parallel:
            schema["maxItems"] = 1
        return schema

    def system_text(self) -> str | None:
        """The system turn that lists the tools; none for ``none``: the model is not to call one."""
        if not self.calls:
            return None
        listed = "\n".join(orjson.dumps(t.definition()).decode() for t in self.tools)
        head = ("# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided "
                f"with function signatures within <tools></tools> XML tags:\n<tools>\n{listed}\n</tools>\n\n")
        if self.choice == "named":
            return head + f"Call the function {self.named} now: reply with its arguments as one JSON object."
        if self.choice == "required":
            many = "one call" if not self.parallel else "one or more calls"
            return head + (f"Reply with a JSON array of {many}, each "
                           '{"name": <function-name>, "arguments": <args-json-object>}.')
        return head + CALL_FORMAT + ("" if self.parallel else "\nCall at most one function.")


def parse(body: dict[str, Any]) -> ToolRequest | None:
    """The request's tools, or None when it has none (a ``tool_choice`` without tools is a 400)."""
    tools_raw, functions = body.get("tools"), body.get("functions")
    if tools_raw not in (None, []) and functions not in (None, []):
        raise invalid("Send either 'tools' or the legacy 'functions', not both.", "functions")
    legacy = functions not in (None, [])
    param, choice_param = ("functions", "function_call") if legacy else ("tools", "tool_choice")
    raw = functions if legacy else tools_raw
    choice = body.get(choice_param) if legacy or body.get("tool_choice") is not None else body.get("function_call")
    if raw in (None, []):
        if choice not in (None, "none"):
            raise invalid(f"'{choice_param}' is only allowed when '{param}' are specified.", choice_param)
        return None
    if not isinstance(raw, list):
        raise invalid(f"'{param}' must be an array of {'functions' if legacy else 'tools'}.", param)
    if len(raw) > MAX_TOOLS:
        raise invalid(f"'{param}' has {len(raw)} entries; the limit is {MAX_TOOLS}.", param)
    tools = [_function(t, f"functions[{i}]") if legacy else _tool(t, i) for i, t in enumerate(raw)]
    names = [t.name for t in tools]
    dup = next((n for n in names if names.count(n) > 1), None)
    if dup is not None:
        raise invalid(f"'{param}' names the function '{dup}' more than once.", param)
    size = len(orjson.dumps([t.definition() for t in tools]))
    if size > MAX_SCHEMA_CHARS * 2:
        raise invalid(f"The tool definitions are {size:,} characters; the limit is {MAX_SCHEMA_CHARS * 2:,}.", param)
    parallel = body.get("parallel_tool_calls")
    if parallel is not None and not isinstance(parallel, bool):
        raise invalid("'parallel_tool_calls' must be true or false.", "parallel_tool_calls")
    mode, named, allowed = _choice(choice, set(names), choice_param)
    if allowed is not None:
        tools = [t for t in tools if t.name in allowed]
    request = ToolRequest(tuple(tools), mode, named, parallel is not False, legacy)
    if request.guided:
        _check_cost(request.schema(), choice_param)
    return request


def _tool(raw: Any, i: int) -> Tool:
    where = f"tools[{i}]"
    kind = raw.get("type") if isinstance(raw, dict) else None
    if kind != "function":
        raise invalid(f"{where}.type must be 'function' (got {kind!r}): Parley calls functions only; custom, "
                      f"web search, file search and other built-in tools are not supported.", f"{where}.type",
                      "unsupported_parameter" if isinstance(kind, str) else None)
    return _function(raw.get("function"), f"{where}.function")


def _function(raw: Any, where: str) -> Tool:
    if not isinstance(raw, dict):
        raise invalid(f"{where} must be an object with a 'name'.", where)
    name, description = raw.get("name"), raw.get("description", "")
    if not isinstance(name, str) or not NAME.match(name):
        raise invalid(f"{where}.name must be 1 to 64 letters, digits, underscores or dashes; got {name!r}.",
                      f"{where}.name")
    if description is None:
        description = ""
    if not isinstance(description, str):
        raise invalid(f"{where}.description must be a string.", f"{where}.description")
    strict = raw.get("strict")
    if strict is not None and not isinstance(strict, bool):
        raise invalid(f"{where}.strict must be true or false.", f"{where}.strict")
    parameters = raw.get("parameters")
    parameters = EMPTY_PARAMETERS if parameters is None else parameters
    _check_parameters(parameters, name, f"{where}.parameters", bool(strict))
    return Tool(name, description, parameters, bool(strict))


def _check_parameters(schema: Any, name: str, where: str, strict: bool) -> None:
    if not isinstance(schema, dict):
        raise invalid(f"Invalid schema for function '{name}': parameters must be a JSON Schema object.", where,
                      "invalid_function_parameters")
    try:
        schema_bounds.check(schema)  # first: the walk below is bounded by its depth limit
    except schema_bounds.SchemaTooCostly as exc:
        raise invalid(f"The schema of function '{name}' is too costly to compile: {exc}.",
                      ".".join(filter(None, [where, exc.where])), "schema_too_costly") from exc
    try:
        jsonschema.Draft202012Validator.check_schema(schema)
    except jsonschema.SchemaError as exc:
        at = ".".join(str(p) for p in exc.path)
        raise invalid(f"Invalid schema for function '{name}': {exc.message}" + (f" (at {at})" if at else "") + ".",
                      where, "invalid_function_parameters") from exc
    if schema.get("type") != "object":
        raise invalid(f"Invalid schema for function '{name}': schema must be a JSON Schema of 'type: \"object\"', "
                      f"got 'type: {orjson.dumps(schema.get('type')).decode()}'.", where,
                      "invalid_function_parameters")
    if strict:
        for path, obj in _objects(schema, ""):
            props = obj.get("properties") or {}
            if obj.get("additionalProperties") is not False:
                raise invalid(f"Invalid schema for function '{name}': with strict, 'additionalProperties' must be "
                              f"false in every object (at {path or 'the root'}).", where, "invalid_function_parameters")
            missing = sorted(set(props) - set(obj.get("required") or []))
            if missing:
                raise invalid(f"Invalid schema for function '{name}': with strict, 'required' must list every "
                              f"property (at {path or 'the root'}: missing {', '.join(missing)}).", where,
                              "invalid_function_parameters")


def _objects(schema: Any, path: str) -> Iterator[tuple[str, dict[str, Any]]]:
    """Every object schema inside ``schema`` (depth bounded by schema_bounds)."""
    if isinstance(schema, dict):
        if schema.get("type") == "object" or "properties" in schema:
            yield path, schema
        for key, value in schema.items():
            if key in ("enum", "const", "default", "examples"):
                continue
            yield from _objects(value, f"{path}.{key}" if path else key)
    elif isinstance(schema, list):
        for i, value in enumerate(schema):
            yield from _objects(value, f"{path}[{i}]")


def _choice(raw: Any, names: set[str], param: str) -> tuple[str, str | None, set[str] | None]:
    """(mode, named function, allowed subset) from ``tool_choice`` or ``function_call``."""
    if raw is None:
        return "auto", None, None
    if raw in ("none", "auto", "required") and not (param == "function_call" and raw == "required"):
        return raw, None, None
    if isinstance(raw, dict) and raw.get("type") == "allowed_tools":
        inner = raw.get("allowed_tools")
        spec: dict[str, Any] = inner if isinstance(inner, dict) else raw
        mode, listed = spec.get("mode"), spec.get("tools")
        if mode not in ("auto", "required") or not isinstance(listed, list) or not listed:
            raise invalid("'tool_choice' allowed_tools needs 'mode' auto or required and a non-empty 'tools' "
                          "array.", param)
        allowed = {_name_in(t, names, param) for t in listed}
        return mode, None, allowed
    if isinstance(raw, dict):
        return "named", _name_in(raw, names, param), None
    choices = "none, auto, or {\"name\": ...}" if param == "function_call" else \
        "none, auto, required, or {\"type\": \"function\", \"function\": {\"name\": ...}}"
    raise invalid(f"Invalid value for '{param}': must be {choices}.", param)


def _name_in(raw: Any, names: set[str], param: str) -> str:
    function = raw.get("function") if isinstance(raw, dict) and isinstance(raw.get("function"), dict) else raw
    if isinstance(raw, dict) and raw.get("type") not in (None, "function"):
        raise invalid(f"Invalid value for '{param}': type must be 'function'.", param)
    name = function.get("name") if isinstance(function, dict) else None
    if not isinstance(name, str):
        raise invalid(f"Invalid value for '{param}': name the function, e.g. "
                      '{"type": "function", "function": {"name": "get_weather"}}.', param)
    if name not in names:
        raise invalid(f"Invalid value for '{param}': no function named '{name}' is in the tools "
                      f"({', '.join(sorted(names))}).", param, "unknown_tool")
    return name


def _check_cost(schema: dict[str, Any], param: str) -> None:
    """The guided schema holds every tool's: bounded as a whole, like a response_format schema."""
    try:
        schema_bounds.check(schema)
    except schema_bounds.SchemaTooCostly as exc:
        raise invalid(f"The tools' schemas together are too costly to compile: {exc}.", param,
                      "schema_too_costly") from exc
    if len(orjson.dumps(schema)) > MAX_SCHEMA_CHARS:
        raise invalid(f"The tools' schemas together are over {MAX_SCHEMA_CHARS:,} characters; send fewer tools "
                      f"with this tool_choice.", param)


# -- the history: calls and results as text ---------------------------------------------------------------
def flatten(raw: list[Any], text: Callable[[Any, str], str]) -> list[dict[str, Any]]:
    """``raw`` messages with assistant calls and tool results written as text in the Hermes format; each
    result must answer a call of the assistant message before it, and every call be answered before the
    next message. ``text(content, where)`` reads a message's content."""
    out: list[dict[str, Any]] = []
    pending: dict[str, str] = {}  # call id -> function name, of the last assistant message
    for i, message in enumerate(raw):
        where = f"messages[{i}]"
        role = message.get("role") if isinstance(message, dict) else None
        if role in ("tool", "function"):
            out.append(_result(message, where, pending, text, out))
            continue
        if pending:
            raise invalid(f"An assistant message with 'tool_calls' must be followed by tool messages responding "
                          f"to each 'tool_call_id'. The following tool_call_ids did not have response messages: "
                          f"{', '.join(pending)}.", f"{where}.role", "tool_call_unanswered")
        if role == "assistant" and (message.get("tool_calls") or message.get("function_call")):
            calls = _calls(message, where)
            pending = {cid: name for cid, name, _ in calls}
            blocks = "\n".join(_block("tool_call", orjson.dumps({"name": n, "arguments": a}).decode())
                               for _, n, a in calls)
            content = message.get("content")
            said = text(content, f"{where}.content") if content not in (None, "") else ""
            out.append({"role": "assistant", "content": f"{said}\n{blocks}" if said else blocks})
        else:
            out.append(message)
    if pending:
        raise invalid(f"The last message calls tools ({', '.join(pending)}) and no tool message answers them; "
                      f"send each result as a 'tool' message.", f"messages[{len(raw) - 1}]", "tool_call_unanswered")
    return out


def _calls(message: dict[str, Any], where: str) -> list[tuple[str, str, Any]]:
    """(id, name, arguments) of an assistant message's calls; a legacy ``function_call`` is one, named by
    its function."""
    legacy = message.get("function_call")
    raw = [{"id": "legacy", "type": "function", "function": legacy}] if legacy else message.get("tool_calls")
    if not isinstance(raw, list):
        raise invalid(f"{where}.tool_calls must be an array.", f"{where}.tool_calls")
    calls = []
    for j, call in enumerate(raw):
        at = f"{where}.tool_calls[{j}]"
        function = call.get("function") if isinstance(call, dict) else None
        cid = call.get("id") if isinstance(call, dict) else None
        if not isinstance(cid, str) or not cid or not isinstance(function, dict) \
                or call.get("type", "function") != "function":
            raise invalid(f"{at} must be {{\"id\", \"type\": \"function\", \"function\": {{\"name\", "
                          f"\"arguments\"}}}}.", at)
        name, arguments = function.get("name"), function.get("arguments")
        if not isinstance(name, str) or not NAME.match(name) or not isinstance(arguments, str):
            raise invalid(f"{at}.function needs a 'name' and 'arguments' (a JSON string).", f"{at}.function")
        try:
            parsed = orjson.loads(arguments) if arguments.strip() else {}
        except orjson.JSONDecodeError:
            parsed = arguments  # written as the client sent it
        calls.append((f"legacy:{name}" if legacy else cid, name, parsed))
    return calls


def _result(message: dict[str, Any], where: str, pending: dict[str, str], text: Callable[[Any, str], str],
            out: list[dict[str, Any]]) -> dict[str, Any]:
    """A tool result as a user turn; results in a row share one turn, as Qwen2.5's template writes them."""
    key = f"legacy:{message.get('name')}" if message.get("role") == "function" else message.get("tool_call_id")
    if not isinstance(key, str) or key not in pending:
        asked = "a 'function' message must follow an assistant 'function_call' of the same name" \
            if message.get("role") == "function" else \
            "messages with role 'tool' must be a response to a preceding message with 'tool_calls' (its " \
            "'tool_call_id' must name one of them)"
        raise invalid(f"Invalid parameter: {where}: {asked}.", f"{where}.role", "tool_call_unmatched")
    del pending[key]
    block = _block("tool_response", text(message.get("content"), f"{where}.content"))
    if out and out[-1].get("tool_results"):
        return _merge(out, block)
    return {"role": "user", "content": block, "tool_results": True}


def _merge(out: list[dict[str, Any]], block: str) -> dict[str, Any]:
    last = out.pop()
    return {**last, "content": last["content"] + "\n" + block}


def _block(tag: str, body: str) -> str:
    return f"<{tag}>\n{body}\n</{tag}>"
