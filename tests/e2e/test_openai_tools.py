"""Function calling end to end with the clients apps use (the official ``openai`` package, LangChain,
litellm) against the real service: vLLM on the CPU with SmolLM2-135M, so these tests check structure
(a forced call's arguments parse and fit the schema, streamed fragments join, a result sent back is
answered, what a pool cannot do is a 400), not how well the model chooses."""
from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator
from typing import Any

import httpx
import jsonschema
import openai
import pytest

from tests.e2e.conftest import Caller
from tests.e2e.service import Service
from tests.e2e.test_openai import saved

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # litellm: no download of its price list

PARAMETERS = {"type": "object", "properties": {
    "city": {"type": "string", "enum": ["Paris", "London", "Tokyo"]},
    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
    "required": ["city", "unit"], "additionalProperties": False}
WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Current weather in a city.",
                                            "parameters": PARAMETERS, "strict": True}}
TIME = {"type": "function", "function": {"name": "get_time", "description": "The local time in a city.",
                                         "parameters": {"type": "object", "properties": {
                                             "city": {"type": "string", "enum": ["Paris", "London"]}},
                                             "required": ["city"], "additionalProperties": False}}}
ASK = [{"role": "user", "content": "What is the weather in Paris, in celsius?"}]
FORCE = {"type": "function", "function": {"name": "get_weather"}}


@pytest.fixture
async def client(service: Service, alice: Caller) -> AsyncIterator[openai.AsyncOpenAI]:
    async with openai.AsyncOpenAI(base_url=f"{service.url('gateway-a')}/v1", api_key=alice.token,
                                  max_retries=0, timeout=300) as c:
        yield c


def _fits(call: Any) -> dict[str, Any]:
    schema = next(t for t in (WEATHER, TIME) if t["function"]["name"] == call.function.name)["function"]["parameters"]
    arguments = json.loads(call.function.arguments)
    jsonschema.validate(arguments, schema)  # type: ignore[arg-type]
    return arguments  # type: ignore[no-any-return]


async def test_a_named_tool_choice_returns_one_call_whose_arguments_fit_the_strict_schema_and_is_saved(
        client: openai.AsyncOpenAI, http: httpx.AsyncClient, alice: Caller) -> None:
    resp = await client.chat.completions.create(model="large", messages=ASK, tools=[WEATHER, TIME],  # type: ignore[list-item]
                                                tool_choice=FORCE, temperature=0, max_tokens=60)  # type: ignore[arg-type]
    choice = resp.choices[0]
    assert choice.finish_reason == "tool_calls", choice
    [call] = choice.message.tool_calls or []
    assert call.type == "function" and call.function.name == "get_weather" and call.id.startswith("call_")
    assert set(_fits(call)) == {"city", "unit"}  # strict: every property, nothing else
    bare = await client.chat.completions.create(model="large", messages=ASK, temperature=0, max_tokens=1)
    assert resp.usage and bare.usage and resp.usage.prompt_tokens > bare.usage.prompt_tokens + 50  # the tools
    reply, _ = await saved(http, alice, resp.id)  # the call is saved (sealed) like any reply text
    assert json.loads(reply["content"]) == json.loads(call.function.arguments)


async def test_required_streamed_without_parallel_calls_is_one_call_named_first_whose_fragments_join_to_json(
        client: openai.AsyncOpenAI) -> None:
    stream = await client.chat.completions.create(
        model="large", messages=[{"role": "user", "content": "Weather and time in Paris and London?"}],
        tools=[WEATHER, TIME], tool_choice="required", parallel_tool_calls=False, temperature=0,  # type: ignore[list-item]
        max_tokens=80, stream=True)
    calls: dict[int, dict[str, Any]] = {}
    finish = None
    async for chunk in stream:
        for choice in chunk.choices:
            finish = choice.finish_reason or finish
            for delta in choice.delta.tool_calls or []:
                if delta.index not in calls:  # the first chunk of a call carries its id and name
                    assert delta.id and delta.function and delta.function.name, delta
                    calls[delta.index] = {"name": delta.function.name, "arguments": ""}
                else:
                    assert delta.id is None
                calls[delta.index]["arguments"] += (delta.function.arguments or "") if delta.function else ""
    assert finish == "tool_calls" and list(calls) == [0]
    call = calls[0]
    schema = next(t for t in (WEATHER, TIME) if t["function"]["name"] == call["name"])["function"]["parameters"]
    jsonschema.validate(json.loads(call["arguments"]), schema)  # type: ignore[arg-type]


async def test_required_with_parallel_calls_makes_calls_that_each_fit_their_schema(
        client: openai.AsyncOpenAI) -> None:
    resp = await client.chat.completions.create(model="large", messages=ASK, tools=[WEATHER, TIME],  # type: ignore[list-item]
                                                tool_choice="required", temperature=0, max_tokens=120)
    choice = resp.choices[0]
    calls = choice.message.tool_calls or []
    assert calls and choice.finish_reason in ("tool_calls", "length")
    whole = calls if choice.finish_reason == "tool_calls" else calls[:-1]  # the cap may cut the last one
    for call in whole:
        _fits(call)
    assert len({c.id for c in calls}) == len(calls)


async def test_a_tool_result_sent_back_gets_an_answer(client: openai.AsyncOpenAI) -> None:
    history = [*ASK, {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function",
         "function": {"name": "get_weather", "arguments": '{"city": "Paris", "unit": "celsius"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "18 degrees and sunny"}]
    resp = await client.chat.completions.create(model="large", messages=history, tools=[WEATHER],  # type: ignore[arg-type, list-item]
                                                tool_choice="none", temperature=0, max_tokens=40)
    choice = resp.choices[0]
    assert choice.message.content and not choice.message.tool_calls and choice.finish_reason in ("stop", "length")
    auto = await client.chat.completions.create(model="large", messages=history, tools=[WEATHER],  # type: ignore[arg-type, list-item]
                                                temperature=0, max_tokens=40)
    message = auto.choices[0].message
    assert message.content or message.tool_calls  # auto: an answer, or another call that parses
    for call in message.tool_calls or []:
        _fits(call)


async def test_what_a_pool_cannot_honour_and_malformed_tools_are_400s(client: openai.AsyncOpenAI) -> None:
    large, small = await client.models.retrieve("large"), await client.models.retrieve("small")
    assert "auto" in large.tool_choice and "auto" not in small.tool_choice  # type: ignore[attr-defined]
    assert "required" in small.tool_choice  # type: ignore[attr-defined]
    cases: list[tuple[dict[str, Any], str]] = [
        ({"model": "small", "tools": [WEATHER]}, "unsupported_tool_choice"),  # auto, and small has no parser
        ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {
            "a": {"type": "strin"}}}}}]}, "invalid_function_parameters"),
        ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "unknown_tool"),
        ({"messages": [*ASK, {"role": "tool", "tool_call_id": "call_x", "content": "1"}]}, "tool_call_unmatched"),
    ]
    for extra, code in cases:
        with pytest.raises(openai.BadRequestError) as info:
            await client.chat.completions.create(**{"model": "large", "messages": ASK, "max_tokens": 8, **extra})
        assert info.value.code == code, (extra, info.value)
    required_on_small = await client.chat.completions.create(
        model="small", messages=ASK, tools=[WEATHER], tool_choice="required", temperature=0, max_tokens=60)  # type: ignore[list-item]
    _fits((required_on_small.choices[0].message.tool_calls or [])[0])


async def test_legacy_functions_answer_with_function_call(client: openai.AsyncOpenAI) -> None:
    resp = await client.chat.completions.create(model="large", messages=ASK, functions=[WEATHER["function"]],  # type: ignore[list-item]
                                                function_call={"name": "get_weather"}, temperature=0, max_tokens=60)
    choice = resp.choices[0]
    assert choice.finish_reason == "function_call" and choice.message.function_call is not None
    jsonschema.validate(json.loads(choice.message.function_call.arguments), PARAMETERS)


# -- LangChain and litellm --------------------------------------------------------------------------------
async def test_langchain_bind_tools_with_tool_choice_and_an_agent_loop_with_a_local_tool(
        service: Service, alice: Caller) -> None:
    from langchain_core.messages import HumanMessage, ToolMessage
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI

    @tool
    def get_weather(city: str) -> str:
        """Current weather in a city."""
        return f"It is 18 degrees and sunny in {city}."

    llm = ChatOpenAI(base_url=f"{service.url('gateway-a')}/v1", api_key=alice.token, model="large",  # type: ignore[arg-type]
                     temperature=0, max_tokens=60, max_retries=0)
    forced = llm.bind_tools([get_weather], tool_choice="get_weather")
    messages: list[Any] = [HumanMessage("What is the weather in Paris?")]
    ai = await forced.ainvoke(messages)
    [call] = ai.tool_calls  # type: ignore[attr-defined]
    assert call["name"] == "get_weather" and isinstance(call["args"].get("city"), str)
    messages += [ai, ToolMessage(get_weather.invoke(call["args"]), tool_call_id=call["id"])]
    answer = await llm.bind_tools([get_weather], tool_choice="none").ainvoke(messages)
    assert isinstance(answer.content, str) and answer.content and not answer.tool_calls  # type: ignore[attr-defined]
    required = await llm.bind_tools([get_weather], tool_choice="required", parallel_tool_calls=False).ainvoke(
        "Weather in Tokyo?")
    assert [c["name"] for c in required.tool_calls] == ["get_weather"]  # type: ignore[attr-defined]


@pytest.mark.parametrize("method", ["json_schema", "function_calling"])
async def test_langchain_structured_output_through_a_schema_or_a_forced_function(service: Service, alice: Caller,
                                                                               method: str) -> None:
    from langchain_openai import ChatOpenAI
    from pydantic import BaseModel, Field

    class Weather(BaseModel):
        city: str = Field(max_length=12)
        celsius: int

    llm = ChatOpenAI(base_url=f"{service.url('gateway-a')}/v1", api_key=alice.token, model="large",  # type: ignore[arg-type]
                     temperature=0, max_tokens=60, max_retries=0)
    found = await llm.with_structured_output(Weather, method=method).ainvoke(  # type: ignore[arg-type]
        "It is 18 degrees in Paris. Extract the city and temperature.")
    assert isinstance(found, Weather) and found.city


async def test_litellm_tool_calls(service: Service, alice: Caller) -> None:
    import litellm

    resp = await litellm.acompletion(model="openai/large", api_base=f"{service.url('gateway-a')}/v1",
                                     api_key=alice.token, messages=ASK, tools=[WEATHER], tool_choice=FORCE,
                                     temperature=0, max_tokens=60)
    [call] = resp.choices[0].message.tool_calls
    assert call.function.name == "get_weather" and resp.choices[0].finish_reason == "tool_calls"
    jsonschema.validate(json.loads(call.function.arguments), PARAMETERS)


# -- the Responses API ------------------------------------------------------------------------------------
RESPONSES_WEATHER = {"type": "function", "name": "get_weather", "description": "Current weather in a city.",
                     "parameters": PARAMETERS, "strict": True}


async def test_responses_function_call_then_its_output_continues_the_conversation(
        client: openai.AsyncOpenAI) -> None:
    first = await client.responses.create(model="large", input=ASK[0]["content"], tools=[RESPONSES_WEATHER],  # type: ignore[list-item]
                                          tool_choice={"type": "function", "name": "get_weather"},
                                          temperature=0, max_output_tokens=60)
    [call] = [item for item in first.output if item.type == "function_call"]
    assert first.status == "completed" and call.name == "get_weather" and call.call_id  # type: ignore[union-attr]
    jsonschema.validate(json.loads(call.arguments), PARAMETERS)  # type: ignore[union-attr]
    answer = await client.responses.create(
        model="large", previous_response_id=first.id, tools=[RESPONSES_WEATHER], tool_choice="none",  # type: ignore[list-item]
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": "18 degrees and sunny"}],  # type: ignore[union-attr]
        temperature=0, max_output_tokens=30)
    assert answer.status in ("completed", "incomplete") and answer.output_text
    assert (await client.responses.retrieve(first.id)).output[0].type == "function_call"


async def test_responses_streamed_call_arguments_join_and_resume_with_the_same_numbers(
        client: openai.AsyncOpenAI) -> None:
    stream = await client.responses.create(model="large", input=ASK[0]["content"], tools=[RESPONSES_WEATHER],  # type: ignore[list-item]
                                           tool_choice="required", parallel_tool_calls=False, temperature=0,
                                           max_output_tokens=80, stream=True, background=True)
    events = [event async for event in stream]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    deltas = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")  # type: ignore[union-attr]
    [done] = [e for e in events if e.type == "response.function_call_arguments.done"]
    assert deltas == done.arguments and jsonschema.validate(json.loads(deltas), PARAMETERS) is None  # type: ignore[union-attr]
    rid = events[0].response.id  # type: ignore[union-attr]
    resumed = [e async for e in await client.responses.retrieve(rid, stream=True, starting_after=2)]
    assert [e.sequence_number for e in resumed] == [e.sequence_number for e in events[3:]]
    assert [e.type for e in resumed] == [e.type for e in events[3:]]
