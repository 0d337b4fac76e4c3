"""The Chat Completions stream of a reply read for calls, through the route's transport without a broker:
multi-token records, calls named on their first chunk, the finish, and a legacy stream."""
from __future__ import annotations

import json

from producers.gateway import routes_openai, tools
from schemas import GenerationFinished, TokensAppended, Usage, new_id
from tests.unit.test_routes_openai import cancels, ids, job_with, payloads  # noqa: F401 (a fixture)

WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}}
# How a worker's records may cut the reply: several tokens each, a record ending inside a name or a string.
RECORDS = ['[{"name": "get_wea', 'ther", "arguments": {"city": "Pa', 'ris"}}, {"name": "get_time", "argu',
           'ments": {}}]']


def _job(records: list[str], status: str = "complete"):  # type: ignore[no-untyped-def]
    gid = new_id()
    events = [TokensAppended(**ids(gid), seq=i, text=t, token_ids=[i]) for i, t in enumerate(records)]
    return job_with(*events, GenerationFinished(
        **ids(gid), plan="paid", message_id="m", status=status, text="".join(records),  # type: ignore[arg-type]
        usage=Usage(prompt_tokens=90, completion_tokens=20), model="Served", pool="large", worker_id="w"))


async def test_records_of_several_tokens_stream_as_calls_named_first_with_fragments_that_join(
        cancels: list[str]) -> None:  # noqa: F811
    request = tools.parse({"tools": [WEATHER, TIME], "tool_choice": "required"})
    out = payloads([line async for line in routes_openai._chunks([_job(RECORDS)], True, request)])
    assert out[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    deltas = [c["choices"][0]["delta"] for c in out[1:] if c != "[DONE]" and c["choices"]]
    calls = [d["tool_calls"][0] for d in deltas if "tool_calls" in d]
    firsts = [c for c in calls if "id" in c]
    assert [(c["index"], c["function"]["name"]) for c in firsts] == [(0, "get_weather"), (1, "get_time")]
    assert all(c["type"] == "function" and c["function"]["arguments"] == "" for c in firsts)
    for index, want in enumerate([{"city": "Paris"}, {}]):
        joined = "".join(c["function"]["arguments"] for c in calls if c["index"] == index)
        assert json.loads(joined) == want
    assert not any("content" in d for d in deltas)
    finish = [c["choices"][0]["finish_reason"] for c in out[1:] if c != "[DONE]" and c["choices"]]
    assert finish[-1] == "tool_calls" and out[-1] == "[DONE]" and out[-2]["usage"]["total_tokens"] == 110


async def test_a_legacy_stream_sends_function_call_deltas_and_finishes_function_call(
        cancels: list[str]) -> None:  # noqa: F811
    request = tools.parse({"functions": [WEATHER["function"]], "function_call": {"name": "get_weather"}})
    out = payloads([line async for line in routes_openai._chunks([_job(['{"ci', 'ty": "Oslo"}'])], False, request)])
    deltas = [c["choices"][0]["delta"] for c in out if c != "[DONE]"]
    assert deltas[1] == {"function_call": {"name": "get_weather", "arguments": ""}}
    assert "".join(d["function_call"]["arguments"] for d in deltas[2:] if "function_call" in d) == '{"city": "Oslo"}'
    assert out[-2]["choices"][0]["finish_reason"] == "function_call"


async def test_auto_streams_text_as_content_and_a_block_as_a_call(cancels: list[str]) -> None:  # noqa: F811
    request = tools.parse({"tools": [WEATHER]})
    records = ["Let me look. <to", 'ol_call>{"name": "get_weather", "arguments": {"city": "Rome"}}</tool', "_call>"]
    out = payloads([line async for line in routes_openai._chunks([_job(records)], False, request)])
    deltas = [c["choices"][0]["delta"] for c in out[1:] if c != "[DONE]"]
    assert "".join(d.get("content", "") for d in deltas) == "Let me look. "
    calls = [d["tool_calls"][0] for d in deltas if "tool_calls" in d]
    assert calls[0]["function"]["name"] == "get_weather"
    assert json.loads("".join(c["function"]["arguments"] for c in calls)) == {"city": "Rome"}
    assert out[-2]["choices"][0]["finish_reason"] == "tool_calls"
