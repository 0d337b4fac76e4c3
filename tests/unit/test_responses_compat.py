"""The Responses dialect without a backend: request parsing, refusals naming the field, and stream
events numbered the same however often the buffer is replayed."""
from __future__ import annotations

from typing import Any

import pytest

from producers.gateway.responses_compat import EventStream, State, generation_of, parse, response_id, response_object
from producers.gateway.sampling_params import CompatError
from schemas import GenerationFinished, GenerationQueued, GenerationStarted, TokensAppended, Usage, new_id
from schemas.gateway import ChatTurn
from schemas.sampling import Sampling

MODELS = {"large": "Smol", "small": "Smol"}


def parsed(**body: Any):  # type: ignore[no-untyped-def]
    return parse({"model": "large", "input": "Hi", **body}, MODELS, "large", 1000)


def test_text_or_message_items_with_instructions_and_options() -> None:
    req = parsed(input=[{"role": "developer", "content": "Be brief."},
                        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Hello"}]}],
                 instructions="Answer in French.", background=True, max_output_tokens=20, temperature=0.5,
                 top_p=0.9, metadata={"k": "v"}, text={"format": {"type": "json_object"}}, tools=[])
    assert req.input == [ChatTurn("system", "Be brief."), ChatTurn("user", "Hello")]
    assert req.instructions == "Answer in French." and req.background and req.store and not req.stream
    assert req.max_output_tokens == 20 and req.temperature == 0.5 and req.sampling.top_p == 0.9
    assert req.sampling.response_format.type == "json_object" and req.echo()["metadata"] == {"k": "v"}
    assert parsed().input == [ChatTurn("user", "Hi")] and parsed().sampling == Sampling(top_p=1.0)
    assert (parsed().echo()["temperature"], parsed().echo()["top_p"]) == (1.0, 1.0)  # OpenAI's defaults, echoed


@pytest.mark.parametrize("body, param", [
    ({"tools": [{"type": "web_search"}]}, "tools"), ({"reasoning": {"effort": "high"}}, "reasoning"),
    ({"include": ["file_search_call.results"]}, "include"), ({"conversation": "c"}, "conversation"),
    ({"input": [{"type": "function_call_output", "output": "1"}]}, "input[0]"),
    ({"background": True, "store": False}, "background"), ({"previous_response_id": "x"}, "previous_response_id"),
    ({"max_output_tokens": 0}, "max_output_tokens"), ({"temperature": 3}, "temperature"), ({"input": ""}, "input"),
])
def test_unsupported_or_bad_fields_are_a_400_naming_them(body: dict[str, Any], param: str) -> None:
    with pytest.raises(CompatError) as info:
        parsed(**body)
    assert info.value.status == 400 and info.value.param is not None and info.value.param.startswith(param)


def test_an_input_of_more_items_than_the_limit_is_a_400_naming_input() -> None:
    from producers.gateway.openai_compat import MAX_MESSAGES
    with pytest.raises(CompatError) as info:
        parsed(input=[{"role": "user", "content": "a"}] * (MAX_MESSAGES + 1))
    assert (info.value.status, info.value.code, info.value.param) == (400, "array_above_max_length", "input")


def test_ids_round_trip() -> None:
    gid = new_id()
    assert generation_of(response_id(gid)) == gid and generation_of("chatcmpl-1") is None


def events(gid: str) -> list[Any]:
    ids = {"generation_id": gid, "conversation_id": "c", "user_id": "u"}
    return [GenerationQueued(**ids, pool="large", model="Smol", lane="paid", position=0, estimated_wait_s=0),
            GenerationStarted(**ids, message_id=gid, model="Smol", pool="large", worker_id="w", first_token_at=1,
                              prompt_tokens=5),
            TokensAppended(**ids, seq=0, text="Hel", token_ids=[1]),
            TokensAppended(**ids, seq=0, text="Hel", token_ids=[1]),  # a duplicate record: counted once
            TokensAppended(**ids, seq=1, text="lo", token_ids=[2]),
            GenerationFinished(**ids, plan="paid", message_id=gid, status="complete", text="Hello",
                               usage=Usage(prompt_tokens=5, completion_tokens=2, cached_prompt_tokens=3),
                               model="Smol", pool="large", worker_id="w")]


def run(gid: str) -> list[dict[str, Any]]:
    stream = EventStream(State(gid, "Smol"), {"background": False})
    out = stream.start()
    for event in events(gid):
        out += stream.feed(event)
    return out


def test_stream_events_are_numbered_from_zero_and_replay_the_same() -> None:
    gid = new_id()
    out = run(gid)
    assert [e["sequence_number"] for e in out] == list(range(len(out)))
    assert [e["type"] for e in out] == [
        "response.created", "response.in_progress", "response.output_item.added", "response.content_part.added",
        "response.output_text.delta", "response.output_text.delta", "response.output_text.done",
        "response.content_part.done", "response.output_item.done", "response.completed"]
    assert "".join(e["delta"] for e in out if e["type"] == "response.output_text.delta") == "Hello"
    assert out == run(gid)  # another gateway replaying the same buffer says the same, number for number
    final = out[-1]["response"]
    assert final["status"] == "completed" and final["output"][0]["content"][0]["text"] == "Hello"
    assert final["usage"]["input_tokens_details"]["cached_tokens"] == 3


def test_a_stopped_or_capped_reply_is_cancelled_or_incomplete() -> None:
    gid = new_id()
    state = State(gid, "Smol")
    for event in events(gid)[:-1]:
        state.feed(event)
    assert state.status == "in_progress" and response_object(state, {})["output"][0]["status"] == "in_progress"
    state.feed(GenerationFinished(generation_id=gid, conversation_id="c", user_id="u", plan="paid", message_id=gid,
                                  status="stopped", text="Hello", usage=Usage(), model="Smol", pool="large",
                                  worker_id="w"))
    body = response_object(state, {})
    assert body["status"] == "cancelled" and body["output"][0]["content"][0]["text"] == "Hello"


def test_a_reply_cut_by_the_output_check_is_incomplete_for_content_filter() -> None:
    gid = new_id()
    state = State(gid, "Smol")
    state.feed(GenerationFinished(generation_id=gid, conversation_id="c", user_id="u", plan="paid", message_id=gid,
                                  status="blocked", text="This reply was withheld.", usage=Usage(), model="Smol",
                                  pool="large", worker_id="w"))
    body = response_object(state, {})
    assert body["status"] == "incomplete" and body["incomplete_details"] == {"reason": "content_filter"}
