"""Function calling without a backend: tools and tool_choice parsed and refused, the history's calls and
results written as text, the guided schema, and replies read back into tool_calls however the text is cut
into records."""
from __future__ import annotations

import json
import random
from typing import Any

import orjson
import pytest

from producers.gateway import tool_calls as calls
from producers.gateway import tools
from producers.gateway.openai_compat import CompatError, completion, parse
from schemas import GenerationFinished, Usage, new_id
from schemas.sampling import Sampling

MODELS = {"large": "SmolLM2-135M-Instruct", "small": "SmolLM2-135M-Instruct"}
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                   "required": ["city"]}}}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}}
USER = [{"role": "user", "content": "Weather in Paris?"}]


def parsed(**body: Any):  # type: ignore[no-untyped-def]
    return parse({"model": "large", "messages": USER, **body}, MODELS, "large", 10_000)


def refused(**body: Any) -> CompatError:
    with pytest.raises(CompatError) as info:
        parsed(**body)
    assert info.value.status == 400
    return info.value


# -- requests ---------------------------------------------------------------------------------------------
def test_a_named_choice_is_guided_by_the_functions_own_schema() -> None:
    chat = parsed(tools=[WEATHER, TIME], tool_choice={"type": "function", "function": {"name": "get_weather"}})
    assert chat.tools is not None and chat.tools.choice == "named" and chat.tools.named == "get_weather"
    s = chat.sampling
    assert s is not None and s.tool_call == "json" and s.response_format is not None
    assert json.loads(s.response_format.json_schema or "") == WEATHER["function"]["parameters"]  # type: ignore[index]


def test_required_is_an_array_of_calls_at_most_one_without_parallel_calls() -> None:
    chat = parsed(tools=[WEATHER, TIME], tool_choice="required", parallel_tool_calls=False)
    schema = json.loads(chat.sampling.response_format.json_schema)  # type: ignore[union-attr]
    assert schema["type"] == "array" and schema["minItems"] == 1 and schema["maxItems"] == 1
    names = [item["properties"]["name"]["enum"] for item in schema["items"]["anyOf"]]
    assert names == [["get_weather"], ["get_time"]]
    assert list(schema["items"]["anyOf"][0]["properties"]) == ["name", "arguments"]  # the name streams first
    assert "maxItems" not in json.loads(parsed(tools=[WEATHER], tool_choice="required").sampling
                                        .response_format.json_schema)  # type: ignore[union-attr]


def test_auto_is_the_default_reads_hermes_blocks_and_stops_after_one_call_without_parallel_calls() -> None:
    chat = parsed(tools=[WEATHER], stop=["END"])
    assert chat.tools is not None and chat.tools.choice == "auto"
    assert chat.sampling is not None and chat.sampling.tool_call == "hermes" and chat.sampling.stop == ["END"]
    one = parsed(tools=[WEATHER], parallel_tool_calls=False)
    assert one.sampling is not None and one.sampling.stop == ["</tool_call>"]


def test_none_calls_nothing_and_lists_no_tools() -> None:
    chat = parsed(tools=[WEATHER], tool_choice="none")
    assert chat.tools is None and chat.sampling == Sampling(top_p=1.0)  # OpenAI's default top_p, no tool call
    assert [t.role for t in chat.history] == ["user"]


def test_the_tools_are_listed_after_the_clients_own_instructions() -> None:
    chat = parsed(tools=[WEATHER], messages=[{"role": "system", "content": "Be brief."}, *USER])
    assert [t.role for t in chat.history] == ["system", "system", "user"]
    listed = chat.history[1].content
    assert chat.history[0].content == "Be brief." and "<tools>" in listed and '"name":"get_weather"' in listed
    assert "<tool_call>" in listed


def test_legacy_functions_map_onto_tools() -> None:
    chat = parsed(functions=[WEATHER["function"]], function_call={"name": "get_weather"})
    assert chat.tools is not None and chat.tools.legacy and chat.tools.named == "get_weather"
    assert parsed(functions=[WEATHER["function"]], function_call="none").tools is None


def test_allowed_tools_narrow_the_set() -> None:
    chat = parsed(tools=[WEATHER, TIME], tool_choice={"type": "allowed_tools", "allowed_tools": {
        "mode": "required", "tools": [{"type": "function", "function": {"name": "get_time"}}]}})
    assert chat.tools is not None and chat.tools.names == {"get_time"} and chat.tools.choice == "required"


@pytest.mark.parametrize("body, param, code", [
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"a": {"type": "strin"}}}}}]}, "tools[0].function.parameters",
     "invalid_function_parameters"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "string"}}}]},
     "tools[0].function.parameters", "invalid_function_parameters"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": []}}]},
     "tools[0].function.parameters", "invalid_function_parameters"),
    ({"tools": [{"type": "function", "function": {"name": "f", "strict": True, "parameters": {
        "type": "object", "properties": {"a": {"type": "string"}}}}}]}, "tools[0].function.parameters",
     "invalid_function_parameters"),
    ({"tools": [{"type": "function", "function": {"name": "has space"}}]}, "tools[0].function.name", None),
    ({"tools": [WEATHER, WEATHER]}, "tools", None),
    ({"tools": [{"type": "web_search"}]}, "tools[0].type", "unsupported_parameter"),
    ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "get_time"}}}, "tool_choice",
     "unknown_tool"),
    ({"tools": [WEATHER], "tool_choice": "sometimes"}, "tool_choice", None),
    ({"tool_choice": "required"}, "tool_choice", None),
    ({"tools": [WEATHER], "parallel_tool_calls": "yes"}, "parallel_tool_calls", None),
    ({"tools": [WEATHER], "tool_choice": "required", "response_format": {"type": "json_object"}},
     "response_format", None),
    ({"tools": [WEATHER], "functions": [WEATHER["function"]]}, "functions", None),
])
def test_bad_tools_are_400s_that_name_the_parameter(body: dict[str, Any], param: str, code: str | None) -> None:
    err = refused(**body)
    assert err.param == param and (code is None or err.code == code), (err.param, err.code, err.message)


def test_a_strict_schema_that_closes_every_object_is_accepted() -> None:
    strict = {"type": "function", "function": {"name": "f", "strict": True, "parameters": {
        "type": "object", "properties": {"a": {"type": "object", "properties": {"b": {"type": "string"}},
                                               "required": ["b"], "additionalProperties": False}},
        "required": ["a"], "additionalProperties": False}}}
    assert parsed(tools=[strict], tool_choice="required").tools.tools[0].strict  # type: ignore[union-attr]


def test_a_schema_too_costly_to_compile_is_refused_like_a_response_format() -> None:
    costly = {"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {f"p{i}": {"type": "string", "maxLength": 50 + i} for i in range(5)}}}}
    assert refused(tools=[costly]).code == "schema_too_costly"


# -- the history ------------------------------------------------------------------------------------------
CALLED = {"role": "assistant", "content": None, "tool_calls": [
    {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}},
    {"id": "call_2", "type": "function", "function": {"name": "get_time", "arguments": "{}"}}]}
RESULTS = [{"role": "tool", "tool_call_id": "call_1", "content": "18 C, sunny"},
           {"role": "tool", "tool_call_id": "call_2", "content": [{"type": "text", "text": "09:00"}]}]


def test_calls_and_results_in_the_history_are_written_as_hermes_text() -> None:
    chat = parsed(tools=[WEATHER, TIME], messages=[*USER, CALLED, *RESULTS])
    roles = [t.role for t in chat.history]
    assert roles == ["system", "user", "assistant", "user"]  # the two results share one user turn
    assert chat.history[2].content == ('<tool_call>\n{"name":"get_weather","arguments":{"city":"Paris"}}\n'
                                       '</tool_call>\n<tool_call>\n{"name":"get_time","arguments":{}}\n</tool_call>')
    assert chat.history[3].content == ("<tool_response>\n18 C, sunny\n</tool_response>\n"
                                       "<tool_response>\n09:00\n</tool_response>")


def test_a_legacy_function_call_and_its_result() -> None:
    chat = parsed(functions=[WEATHER["function"]], messages=[
        *USER, {"role": "assistant", "content": None, "function_call": {"name": "get_weather", "arguments": "{}"}},
        {"role": "function", "name": "get_weather", "content": "rain"}])
    assert chat.history[-1].content == "<tool_response>\nrain\n</tool_response>"


@pytest.mark.parametrize("history, code", [
    ([*USER, {"role": "tool", "tool_call_id": "call_9", "content": "x"}], "tool_call_unmatched"),
    ([*USER, CALLED, RESULTS[0], RESULTS[0]], "tool_call_unmatched"),  # one call answered twice
    ([*USER, CALLED, RESULTS[0], *USER], "tool_call_unanswered"),
    ([*USER, CALLED], "tool_call_unanswered"),
    ([*USER, {"role": "function", "name": "get_weather", "content": "x"}], "tool_call_unmatched"),
])
def test_a_result_without_its_call_or_a_call_without_its_result_is_a_400(history: list[Any], code: str) -> None:
    assert refused(tools=[WEATHER, TIME], messages=history).code == code


# -- replies ----------------------------------------------------------------------------------------------
def _read(request: tools.ToolRequest, text: str, cuts: list[int]) -> tuple[calls.Reader, list[calls.Delta]]:
    r, deltas, at = calls.reader(request, "g1"), [], 0
    for cut in [*cuts, len(text)]:
        deltas += r.feed(text[at:cut])
        at = cut
    return r, deltas + r.close()


def _cuts(text: str, rng: random.Random) -> list[int]:
    return sorted(rng.sample(range(1, len(text)), rng.randint(0, min(12, len(text) - 1))))


REQUIRED = tools.parse({"tools": [WEATHER, TIME], "tool_choice": "required"})
ARRAY = ('[ {"name": "get_weather", "arguments": {"city": "Pa\\"ris {}", "days": 2}},\n'
         ' {"name":"get_time","arguments":{}}]')


@pytest.mark.parametrize("seed", range(40))
def test_required_arguments_stream_as_fragments_that_join_to_each_calls_json_however_records_cut(seed: int) -> None:
    assert REQUIRED is not None
    r, deltas = _read(REQUIRED, ARRAY, _cuts(ARRAY, random.Random(seed)))
    starts = [d for d in deltas if d.kind == "start"]
    assert [(d.index, d.text) for d in starts] == [(0, "get_weather"), (1, "get_time")]
    for i, want in enumerate([{"city": 'Pa"ris {}', "days": 2}, {}]):
        fragments = [d.text for d in deltas if d.kind == "args" and d.index == i]
        assert json.loads("".join(fragments)) == want
        first_args = next(j for j, d in enumerate(deltas) if d.kind == "args" and d.index == i)
        assert deltas.index(starts[i]) < first_args  # the call is named before its arguments
    assert r.content == "" and len({c.id for c in r.calls}) == 2


def test_a_named_reply_is_the_arguments_and_its_first_chunk_names_the_call() -> None:
    named = tools.parse({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "get_weather"}}})
    assert named is not None
    r, deltas = _read(named, '{"city": "Oslo"}', [1, 2, 9])
    first = calls.delta_json(named, r, deltas[0])
    assert first == {"tool_calls": [{"index": 0, "id": r.calls[0].id, "type": "function",
                                     "function": {"name": "get_weather", "arguments": ""}}]}
    later = [calls.delta_json(named, r, d) for d in deltas[1:]]
    assert all(set(d["tool_calls"][0]) == {"index", "function"} for d in later if d)  # type: ignore[index]
    assert json.loads("".join(d.text for d in deltas if d.kind == "args")) == {"city": "Oslo"}


AUTO = tools.parse({"tools": [WEATHER, TIME]})
HERMES = ('Let me check. <tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
          '<tool_call>{"name": "get_time", "arguments": "{}"}</tool_call>')


@pytest.mark.parametrize("seed", range(40))
def test_auto_keeps_text_as_content_and_each_block_as_one_call_however_records_cut(seed: int) -> None:
    assert AUTO is not None
    r, deltas = _read(AUTO, HERMES, _cuts(HERMES, random.Random(seed)))
    assert "".join(d.text for d in deltas if d.kind == "content") == "Let me check. " == r.content
    assert [(c.name, json.loads(c.arguments)) for c in r.calls] == [("get_weather", {"city": "Paris"}),
                                                                      ("get_time", {})]
    assert not any("<" in d.text for d in deltas if d.kind == "content")  # no half tag shown


def test_auto_shows_a_block_that_is_not_a_call_and_plain_text_as_it_is() -> None:
    assert AUTO is not None
    text = "a < b, and <tool_call>{not json}</tool_call> <tool_call>{\"name\": \"rm_rf\"}</tool_call> done"
    r, _ = _read(AUTO, text, [3, 12, 30])
    assert r.calls == [] and r.content == text


def test_auto_without_parallel_calls_makes_one_and_reads_a_block_cut_by_its_stop() -> None:
    one = tools.parse({"tools": [WEATHER, TIME], "parallel_tool_calls": False})
    assert one is not None
    r, _ = _read(one, HERMES, [])
    assert [c.name for c in r.calls] == ["get_weather"]
    cut, _ = _read(one, '<tool_call>\n{"name": "get_time", "arguments": {}}\n', [5])  # stopped at </tool_call>
    assert [c.name for c in cut.calls] == ["get_time"]


def _finished(text: str, status: str = "complete") -> GenerationFinished:
    return GenerationFinished(generation_id=new_id(), conversation_id="c", user_id="u", plan="free",
                              message_id="m", status=status, text=text,  # type: ignore[arg-type]
                              usage=Usage(prompt_tokens=50, completion_tokens=9), model="Smol", pool="large",
                              worker_id="w")


def test_a_completion_that_called_tools_has_tool_calls_and_finish_reason_tool_calls() -> None:
    assert REQUIRED is not None and AUTO is not None
    body = completion([_finished(ARRAY)], None, REQUIRED)
    choice = body["choices"][0]
    assert choice["finish_reason"] == "tool_calls" and choice["message"]["content"] is None
    assert [c["function"]["name"] for c in choice["message"]["tool_calls"]] == ["get_weather", "get_time"]
    assert all(c["id"].startswith("call_") and c["type"] == "function" for c in choice["message"]["tool_calls"])
    plain = completion([_finished("Just text.")], None, AUTO)["choices"][0]
    assert plain["finish_reason"] == "stop" and plain["message"]["content"] == "Just text."
    assert plain["message"]["tool_calls"] is None
    cut = completion([_finished(ARRAY[:30], "length")], None, REQUIRED)["choices"][0]
    assert cut["finish_reason"] == "length" and cut["message"]["tool_calls"][0]["function"]["name"] == "get_weather"


def test_a_legacy_completion_answers_with_function_call() -> None:
    legacy = tools.parse({"functions": [WEATHER["function"]], "function_call": {"name": "get_weather"}})
    assert legacy is not None
    choice = completion([_finished('{"city": "Rome"}')], None, legacy)["choices"][0]
    assert choice["finish_reason"] == "function_call"
    assert choice["message"]["function_call"] == {"name": "get_weather", "arguments": '{"city": "Rome"}'}
    r, deltas = _read(legacy, '{"city": "Rome"}', [4])
    shown = [calls.delta_json(legacy, r, d) for d in deltas]
    assert shown[0] == {"function_call": {"name": "get_weather", "arguments": ""}}
    assert "".join(s["function_call"]["arguments"] for s in shown[1:]) == '{"city": "Rome"}'  # type: ignore[index]


def test_the_tool_text_is_valid_json_for_the_engine() -> None:
    assert REQUIRED is not None
    orjson.dumps(REQUIRED.schema())
    assert REQUIRED.system_text() and "get_time" in REQUIRED.system_text()  # type: ignore[operator]


# -- pools, reservation, overflow -------------------------------------------------------------------------
def test_each_pool_says_which_tool_choices_it_honours_and_auto_elsewhere_is_a_400_that_says_why() -> None:
    from infra.config.pools import load_pools
    from infra.config.settings import Settings
    from producers.gateway.routes_openai import check_tools, tool_modes

    settings = Settings()
    pools = load_pools(settings)
    assert pools["large"].tool_choices == ("none", "required", "named", "auto")
    assert pools["small"].tool_choices == ("none", "required", "named")
    assert pools["small"].honours("json") and not pools["small"].honours("hermes") and pools["small"].honours(None)
    sim = msgspec_replace(pools["large"], engine="sim")
    assert sim.tool_choices == ("none",) and not sim.honours("json")
    assert tool_modes(settings)["large"] == pools["large"].tool_choices
    check_tools(settings, "large", tools.parse({"tools": [WEATHER]}))
    check_tools(settings, "small", tools.parse({"tools": [WEATHER], "tool_choice": "required"}))
    with pytest.raises(CompatError) as info:
        check_tools(settings, "small", tools.parse({"tools": [WEATHER]}))
    err = info.value
    assert (err.status, err.param, err.code) == (400, "tool_choice", "unsupported_tool_choice")
    assert "no tool parser" in err.message and "large" in err.message


def msgspec_replace(struct: Any, **changes: Any) -> Any:
    import msgspec

    return msgspec.structs.replace(struct, **changes)


def test_the_reservation_covers_the_tool_definitions() -> None:
    from consumers.admission import AdmissionRules, estimate_prompt
    from schemas import MessageSubmitted

    chat = parsed(tools=[WEATHER, TIME])
    bare = parsed()

    def submitted(history: Any) -> MessageSubmitted:
        return MessageSubmitted(generation_id="g", conversation_id="c", user_id="u", plan="free", message_id="m",
                                client_message_id="k", content=USER[0]["content"], history=history)

    rules = AdmissionRules()
    listed = len(chat.history[0].content)
    assert estimate_prompt(submitted(chat.history), rules) - estimate_prompt(submitted(bare.history), rules) \
        >= listed // rules.chars_per_token - 1


class _Tokens:
    def count(self, text: str) -> int:
        return len(text) // 4 + 1

    def chat_ids(self, messages: list[dict[str, str]]) -> list[int]:
        return list(range(sum(self.count(m["content"]) + 5 for m in messages)))


@pytest.mark.parametrize("tool_choice, overflows", [(None, False), ("required", True), ("none", True)])
def test_a_request_is_never_prepared_for_a_pool_that_cannot_honour_its_calls(tool_choice: str | None,
                                                                            overflows: bool) -> None:
    """large -> small overflow: auto needs the tool parser small lacks, so no alternate is made (the
    scheduler then keeps it on large); and no tool request gets a prepared reply."""
    from datetime import UTC, datetime

    from consumers.prompt.builder import PromptBuilder
    from infra.config.pools import load_pools
    from infra.config.settings import Settings
    from infra.stores.conversations import Message
    from schemas import RequestAdmitted

    pools = load_pools(Settings())
    builder = PromptBuilder(None, None, None, lambda pool: _Tokens(), 6000, lambda pool: 2048 if pool == "large"  # type: ignore[arg-type]
                            else 1024, honours=lambda pool, kind: pools[pool].honours(kind))
    body = {"tools": [WEATHER]} | ({"tool_choice": tool_choice} if tool_choice else {})
    chat = parsed(**body)
    req = RequestAdmitted(generation_id="g", conversation_id="c", user_id="u", plan="free", message_id="m",
                          client_message_id="k", content=chat.content, pool="large", reply_cap=64,
                          reserved_tokens=900, history=chat.history, sampling=chat.sampling)
    user = Message("c", 0, "m", "user", chat.content, created_at=datetime.now(UTC))
    built = builder._build(req, [], None, user)
    assert [a.pool for a in built.alternates] == (["small"] if overflows else [])  # type: ignore[union-attr]
