"""Function tools on the Responses API without a backend: its tools and input items in Chat terms, a reply
read as function_call items, and their stream events numbered the same on every replay."""
from __future__ import annotations

import json
from typing import Any

import pytest

from producers.gateway import responses_tools as rtools
from producers.gateway.responses_compat import EventStream, State, parse, response_object
from producers.gateway.sampling_params import CompatError
from schemas import GenerationFinished, GenerationStarted, TokensAppended, Usage, new_id

MODELS = {"large": "Smol", "small": "Smol"}
WEATHER = {"type": "function", "name": "get_weather", "description": "Weather in a city.", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}


def parsed(**body: Any):  # type: ignore[no-untyped-def]
    return parse({"model": "large", "input": "Weather in Paris?", **body}, MODELS, "large", 10_000)


def test_function_tools_and_a_named_choice_are_guided_and_echoed() -> None:
    req = parsed(tools=[WEATHER], tool_choice={"type": "function", "name": "get_weather"})
    assert req.tools is not None and req.tools.named == "get_weather"
    assert req.sampling is not None and req.sampling.tool_call == "json"
    echo = req.echo()
    assert echo["tools"] == [WEATHER] and echo["tool_choice"] == {"type": "function", "name": "get_weather"}
    assert echo["parallel_tool_calls"] is True and [t.role for t in req.input] == ["system", "user"]
    assert parsed(tools=[], tool_choice="auto").tools is None  # what the SDKs send with no tools


def test_allowed_tools_are_enforced() -> None:
    time = {**WEATHER, "name": "get_time"}
    req = parsed(tools=[WEATHER, time], tool_choice={"type": "allowed_tools", "mode": "required",
                                                     "tools": [{"type": "function", "name": "get_time"}]})
    assert req.tools is not None and req.tools.names == {"get_time"}


@pytest.mark.parametrize("body, param", [
    ({"tools": [{**WEATHER, "parameters": {"type": "string"}}]}, "tools[0].parameters"),
    ({"tools": [WEATHER], "tool_choice": {"type": "function", "name": "nope"}}, "tool_choice"),
    ({"tools": [{"type": "web_search"}]}, "tools[0].type"),
    ({"input": [{"type": "function_call_output", "call_id": "call_9", "output": "1"}]}, "input[0]"),
])
def test_bad_tools_and_unmatched_outputs_are_400s(body: dict[str, Any], param: str) -> None:
    with pytest.raises(CompatError) as info:
        parsed(**body)
    assert info.value.status == 400 and (info.value.param or "").startswith(param), info.value.param


def test_function_call_and_output_items_are_a_call_and_its_result() -> None:
    req = parsed(tools=[WEATHER], input=[
        {"role": "user", "content": "Weather in Paris?"},
        {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": '{"city":"Paris"}'},
        {"type": "function_call_output", "call_id": "call_1", "output": "18 C"}])
    assert [t.role for t in req.input] == ["system", "user", "assistant", "user"]
    assert "<tool_call>" in req.input[2].content and req.input[3].content == "<tool_response>\n18 C\n</tool_response>"


def test_an_output_answers_the_previous_responses_call() -> None:
    prior_request = rtools.request_of({"tools": [WEATHER], "tool_choice": "required"})
    assert prior_request is not None
    prior = rtools.prior_message(prior_request, "g0", '[{"name": "get_weather", "arguments": {"city": "Oslo"}}]')
    assert prior is not None
    call_id = prior["tool_calls"][0]["id"]
    req = parse({"model": "large", "tools": [WEATHER], "previous_response_id": "resp_g0",
                 "input": [{"type": "function_call_output", "call_id": call_id, "output": "rain"}]},
                MODELS, "large", 10_000, [prior])
    assert [t.role for t in req.input] == ["system", "assistant", "user"]
    assert rtools.prior_message(prior_request, "g0", "not a call") is None


def _events(gid: str, pieces: list[str]) -> list[Any]:
    ids = {"generation_id": gid, "conversation_id": "c", "user_id": "u"}
    return [GenerationStarted(**ids, message_id=gid, model="Smol", pool="large", worker_id="w", first_token_at=1,
                              prompt_tokens=5),
            *[TokensAppended(**ids, seq=i, text=p, token_ids=[i]) for i, p in enumerate(pieces)],
            GenerationFinished(**ids, plan="paid", message_id=gid, status="complete", text="".join(pieces),
                               usage=Usage(prompt_tokens=5, completion_tokens=len(pieces)), model="Smol",
                               pool="large", worker_id="w")]


def _run(gid: str, echo: dict[str, Any], pieces: list[str]) -> list[dict[str, Any]]:
    stream = EventStream(State(gid, "Smol"), echo)
    out = stream.start()
    for event in _events(gid, pieces):
        out += stream.feed(event)
    return out


def test_a_call_streams_as_a_function_call_item_with_argument_deltas_numbered_the_same_on_replay() -> None:
    gid, echo = new_id(), {"tools": [WEATHER], "tool_choice": "required", "parallel_tool_calls": False}
    pieces = ['[{"name": "get_', 'weather", "argu', 'ments": {"ci', 'ty": "Pa', 'ris"}}]']
    out = _run(gid, echo, pieces)
    assert [e["sequence_number"] for e in out] == list(range(len(out)))
    types = [e["type"] for e in out]
    assert types[:3] == ["response.created", "response.in_progress", "response.output_item.added"]
    assert types[-3:] == ["response.function_call_arguments.done", "response.output_item.done",
                          "response.completed"]
    deltas = [e["delta"] for e in out if e["type"] == "response.function_call_arguments.delta"]
    assert len(deltas) > 1 and json.loads("".join(deltas)) == {"city": "Paris"}
    added = out[2]["item"]
    assert added["type"] == "function_call" and added["name"] == "get_weather" and added["arguments"] == ""
    final = out[-1]["response"]
    [item] = final["output"]
    assert item["type"] == "function_call" and item["call_id"] == added["call_id"] and item["status"] == "completed"
    assert json.loads(item["arguments"]) == {"city": "Paris"} and final["tools"] == [WEATHER]
    assert out == _run(gid, echo, pieces)  # another gateway replaying the buffer numbers them the same
    state = State(gid, "Smol")
    for event in _events(gid, pieces):
        state.feed(event)
    assert response_object(state, echo)["output"] == final["output"]  # a retrieve says what the stream said


def test_text_and_a_call_under_auto_are_a_message_and_a_function_call() -> None:
    gid, echo = new_id(), {"tools": [WEATHER], "tool_choice": "auto"}
    out = _run(gid, echo, ["Checking. <tool", '_call>{"name": "get_weather", "arguments": {"city": "Rome"}}',
                           "</tool_call>"])
    final = out[-1]["response"]
    assert [i["type"] for i in final["output"]] == ["message", "function_call"]
    assert final["output"][0]["content"][0]["text"] == "Checking. "
    assert "".join(e["delta"] for e in out if e["type"] == "response.output_text.delta") == "Checking. "
