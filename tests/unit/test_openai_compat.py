"""The OpenAI dialect without any backend: request translation, refusals of what Parley does not do,
response and chunk shapes, and errors in OpenAI's shape only on the OpenAI paths."""
from __future__ import annotations

from typing import Any

import orjson
import pytest
from fastapi.testclient import TestClient

from infra.config.settings import Settings
from infra.stores.accounts import User
from producers.gateway.app import create_app
from producers.gateway.errors import ApiError
from producers.gateway.openai_compat import (
    CompatError,
    chunk,
    completion,
    error_json,
    model_list,
    parse,
)
from schemas import GenerationFinished, Usage, new_id
from schemas.gateway import ChatTurn
from schemas.sampling import Sampling, TokenLogprob, TopLogprob

MODELS = {"large": "SmolLM2-135M-Instruct", "small": "SmolLM2-135M-Instruct"}
USER = [{"role": "user", "content": "Hi there"}]


def parsed(**body: Any):  # type: ignore[no-untyped-def]
    return parse({"model": "large", "messages": USER, **body}, MODELS, "large", 100)


def refused(**body: Any) -> CompatError:
    with pytest.raises(CompatError) as info:
        parsed(**body)
    return info.value


def test_a_plain_request_becomes_history_pool_cap_and_temperature() -> None:
    msgs = [{"role": "developer", "content": "Be brief."}, {"role": "user", "content": "Hello"},
            {"role": "assistant", "content": "Hi!"}, {"role": "user", "content": "  What is   2+2?  "}]
    chat = parsed(messages=msgs, max_tokens=20, temperature=0.2, stream=True,
                  stream_options={"include_usage": True}, user="someone", n=1, top_p=1)
    assert chat.pool == "large" and chat.max_tokens == 20 and chat.temperature == 0.2
    assert chat.stream and chat.include_usage
    assert chat.history == [ChatTurn("system", "Be brief."), ChatTurn("user", "Hello"),
                            ChatTurn("assistant", "Hi!"), ChatTurn("user", "  What is   2+2?  ")]
    assert chat.content == "  What is   2+2?  " and chat.title == "What is 2+2?"
    assert parsed(max_tokens=5, max_completion_tokens=7).max_tokens == 7  # the newer name wins
    assert parsed().max_tokens is None and not parsed().stream
    # OpenAI's defaults when none is named: temperature 1, top_p 1 (the page's own are 0.7 and 0.95)
    assert parsed().temperature == 1.0 and parsed().sampling == Sampling(top_p=1.0)
    assert parsed(top_p=0.5).sampling == Sampling(top_p=0.5) and parsed(temperature=0).temperature == 0.0


def test_text_parts_are_joined_and_anything_else_is_refused() -> None:
    parts = [{"type": "text", "text": "one"}, {"type": "text", "text": "two"}]
    assert parsed(messages=[{"role": "user", "content": parts}]).content == "one\ntwo"
    image = [{"type": "text", "text": "what is this?"}, {"type": "image_url", "image_url": {"url": "x"}}]
    err = refused(messages=[{"role": "user", "content": image}])
    assert err.status == 400 and err.param == "messages[0].content[1]" and "image_url" in err.message


def test_the_served_model_name_means_the_default_pool_and_unknown_models_are_404() -> None:
    assert parse({"model": "small", "messages": USER}, MODELS, "large", 100).pool == "small"
    assert parse({"model": "SmolLM2-135M-Instruct", "messages": USER}, MODELS, "large", 100).pool == "large"
    err = refused(model="gpt-4o")
    assert (err.status, err.code, err.param) == (404, "model_not_found", "model")
    assert "large" in err.message and "SmolLM2-135M-Instruct" in err.message
    assert refused(model=None).status == 400


@pytest.mark.parametrize("param, value", [
    ("audio", {"voice": "alloy"}), ("modalities", ["audio"]),
    ("logit_bias", {"50256": -100}), ("prediction", {"type": "content", "content": "x"}),
])
def test_unsupported_features_get_a_400_naming_the_parameter(param: str, value: Any) -> None:
    err = refused(**{param: value})
    assert err.status == 400 and err.param == param and "not supported" in err.message


def test_defaults_of_unsupported_features_are_accepted() -> None:
    chat = parsed(tools=[], tool_choice="none", logprobs=False, n=1, response_format={"type": "text"},
                  modalities=["text"], stop=None, presence_penalty=0, frequency_penalty=0.0, store=False)
    assert chat.pool == "large" and chat.sampling == Sampling(top_p=1.0) and chat.n == 1


def test_the_issue_parameter_combination_and_vllm_extensions_are_carried() -> None:
    chat = parsed(temperature=0.7, top_p=0.9, stop=["\n\n"], presence_penalty=0.1, seed=1, max_tokens=30,
                  top_k=40, min_p=0.05, repetition_penalty=1.1, min_tokens=2, ignore_eos=True, logprobs=True,
                  top_logprobs=2, n=2, response_format={"type": "json_object"})
    s = chat.sampling
    assert chat.temperature == 0.7 and chat.max_tokens == 30 and chat.n == 2 and s is not None
    assert (s.top_p, s.top_k, s.min_p, s.seed, s.stop) == (0.9, 40, 0.05, 1, ["\n\n"])
    assert (s.presence_penalty, s.repetition_penalty, s.min_tokens, s.ignore_eos) == (0.1, 1.1, 2, True)
    assert s.logprobs and s.top_logprobs == 2 and s.response_format.type == "json_object"  # type: ignore[union-attr]


@pytest.mark.parametrize("body, param", [
    ({"messages": []}, "messages"),
    ({"messages": [{"role": "assistant", "content": "hi"}]}, "messages"),  # nothing for Parley to answer
    ({"messages": [{"role": "user", "content": "   "}]}, "messages[0]"),
    ({"messages": [{"role": "tool", "content": "42", "tool_call_id": "c"}, *USER]}, "messages[0].role"),
    ({"messages": [{"role": "wizard", "content": "hi"}]}, "messages[0].role"),
    ({"messages": [{"role": "user", "content": None}]}, "messages[0].content"),
    ({"max_tokens": 0}, "max_tokens"), ({"max_completion_tokens": "9"}, "max_completion_tokens"),
    ({"temperature": 2.5}, "temperature"), ({"stream": "yes"}, "stream"), ({"top_p": 0}, "top_p"),
    ({"top_p": 1.5}, "top_p"), ({"top_k": -2}, "top_k"), ({"min_p": 2}, "min_p"), ({"seed": 1.5}, "seed"),
    ({"stop": [""]}, "stop"), ({"stop": ["a", "b", "c", "d", "e"]}, "stop"), ({"stop": 3}, "stop"),
    ({"presence_penalty": 3}, "presence_penalty"), ({"frequency_penalty": "x"}, "frequency_penalty"),
    ({"repetition_penalty": 0}, "repetition_penalty"), ({"min_tokens": -1}, "min_tokens"),
    ({"max_tokens": 5, "min_tokens": 6}, "min_tokens"), ({"ignore_eos": "yes"}, "ignore_eos"),
    ({"top_logprobs": 3}, "top_logprobs"), ({"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
    ({"n": 0}, "n"), ({"n": 9}, "n"), ({"response_format": {"type": "yaml"}}, "response_format"),
    ({"response_format": {"type": "json_schema"}}, "response_format.json_schema"),
    ({"stream_options": {"include_usage": True}}, "stream_options"),  # without stream=true
    ({"frobnicate": 1}, "frobnicate"),
])
def test_malformed_requests_get_a_400_naming_the_parameter(body: dict[str, Any], param: str) -> None:
    err = refused(**body)
    assert err.status == 400 and err.param == param, err.message


def test_more_messages_than_the_limit_are_refused_before_any_is_read() -> None:
    from producers.gateway.openai_compat import MAX_MESSAGES
    tiny = [{"role": "user", "content": "a"}] * MAX_MESSAGES
    at_limit = parse({"model": "large", "messages": tiny}, MODELS, "large", MAX_MESSAGES)
    assert len(at_limit.history) == MAX_MESSAGES  # at the limit: accepted
    # one past it, with a lone surrogate and a malformed item beyond: the count is named, nothing else read
    over = refused(messages=[*tiny, {"role": "user", "content": "\ud800"}, 7])
    assert (over.status, over.code, over.param) == (400, "array_above_max_length", "messages"), over.message
    assert f"{MAX_MESSAGES + 2:,} items" in over.message


def test_size_limits_are_context_length_errors() -> None:
    long_last = refused(messages=[{"role": "user", "content": "x" * 101}])
    assert (long_last.status, long_last.code) == (400, "context_length_exceeded")
    history = [{"role": "user", "content": "y" * 90}, {"role": "assistant", "content": "z" * 90}] * 3
    too_much = refused(messages=[*history, *USER])
    assert too_much.code == "context_length_exceeded" and "total" in too_much.message


def finished(status: str, text: str = "Paris.") -> GenerationFinished:
    return GenerationFinished(generation_id=new_id(), conversation_id="c", user_id="u", plan="free",
                              message_id="m", status=status, text=text,  # type: ignore[arg-type]
                              usage=Usage(prompt_tokens=30, completion_tokens=3), model="Smol", pool="large",
                              worker_id="w")


def test_a_finished_reply_is_a_chat_completion() -> None:
    event = finished("complete")
    body = completion([event])
    assert body["id"] == f"chatcmpl-{event.generation_id}" and body["object"] == "chat.completion"
    assert body["model"] == "Smol" and isinstance(body["created"], int) and body["created"] > 1_700_000_000
    assert body["choices"][0]["message"] == {"role": "assistant", "content": "Paris.", "refusal": None}
    assert body["choices"][0]["finish_reason"] == "stop"
    assert body["usage"] == {"prompt_tokens": 30, "completion_tokens": 3, "total_tokens": 33,
                             "prompt_tokens_details": {"cached_tokens": 0}}
    assert completion([finished("length")])["choices"][0]["finish_reason"] == "length"
    assert completion([finished("stopped")])["choices"][0]["finish_reason"] == "stop"
    two = completion([finished("complete", "A"), finished("length", "B")],
                     [None, [TokenLogprob("B", -0.5, [TopLogprob("B", -0.5), TopLogprob("C", -1.0)])]])
    assert [(c["index"], c["message"]["content"], c["finish_reason"]) for c in two["choices"]] == [
        (0, "A", "stop"), (1, "B", "length")]
    assert two["usage"]["completion_tokens"] == 6 and two["choices"][0]["logprobs"] is None
    token = two["choices"][1]["logprobs"]["content"][0]
    assert token["token"] == "B" and token["logprob"] == -0.5 and token["bytes"] == [66]
    assert [t["token"] for t in token["top_logprobs"]] == ["B", "C"]


def test_chunks_are_sse_data_lines() -> None:
    gid = new_id()
    line = chunk(gid, "Smol", {"content": "Hel"})
    assert line.startswith(b"data: ") and line.endswith(b"\n\n")
    body = orjson.loads(line[len(b"data: "):])
    assert body["object"] == "chat.completion.chunk" and body["id"] == f"chatcmpl-{gid}"
    assert body["choices"] == [{"index": 0, "delta": {"content": "Hel"}, "logprobs": None, "finish_reason": None}]
    assert "usage" not in body
    usage = orjson.loads(chunk(gid, "Smol", None, usage=Usage(prompt_tokens=4, completion_tokens=2),
                               include_usage=True)[6:])
    assert usage["choices"] == [] and usage["usage"]["total_tokens"] == 6


def test_native_errors_translate_to_openai_statuses_and_types() -> None:
    def shape(err: ApiError) -> tuple[int, str, str | None]:
        status, body = error_json(err)
        assert set(body["error"]) == {"message", "type", "param", "code"} and body["error"]["message"]
        return status, body["error"]["type"], body["error"]["code"]

    assert shape(ApiError(401, "unauthorized", "no")) == (401, "invalid_request_error", "invalid_api_key")
    assert shape(ApiError(429, "rate_limit", "slow", 3)) == (429, "tokens", "rate_limit_exceeded")
    assert shape(ApiError(429, "concurrency", "wait", 3)) == (429, "requests", "rate_limit_exceeded")
    assert shape(ApiError(429, "daily_budget", "tomorrow", 3600)) == (429, "insufficient_quota",
                                                                      "insufficient_quota")
    assert shape(ApiError(503, "overloaded", "busy", 5)) == (503, "server_error", "overloaded")
    assert shape(ApiError(413, "too_long", "long")) == (400, "invalid_request_error", "context_length_exceeded")
    assert shape(ApiError(422, "invalid", "empty")) == (400, "invalid_request_error", "invalid")


def test_model_list_names_pools_and_the_served_model() -> None:
    data = model_list(MODELS, "large")
    assert [m["id"] for m in data] == ["large", "small", "SmolLM2-135M-Instruct"]
    assert all(m["object"] == "model" and m["owned_by"] == "parley" and m["created"] > 0 for m in data)
    assert data[0]["served_model_name"] == "SmolLM2-135M-Instruct" and data[2]["pool"] == "large"


# -- through the app, without backends -------------------------------------------------------------------
@pytest.fixture
def client() -> TestClient:
    # No `with`: the lifespan (Kafka, Redis, Cassandra) never starts; nothing here reaches a backend.
    app = create_app(Settings().with_(public_url="http://testserver"), dict(MODELS))  # the TestClient's host

    async def user_for_token(token: str) -> User | None:
        return User("u1", "free") if token == "good" else None

    app.state.gateway.user_for_token = user_for_token
    return TestClient(app)


GOOD = {"Authorization": "Bearer good"}


def test_openai_paths_answer_errors_in_openai_shape_and_native_paths_keep_theirs(client: TestClient) -> None:
    r = client.post("/v1/chat/completions", json={"model": "large", "messages": USER},
                    headers={"Authorization": "Basic x"})
    assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
    assert set(r.json()["error"]) == {"message", "type", "param", "code"}
    native = client.post("/v1/conversations", json={}, headers={"Authorization": "Basic x"})
    assert native.status_code == 401 and native.json() == {"error": {"code": "unauthorized",
                                                                     "message": native.json()["error"]["message"]}}
    bad_json = client.post("/v1/chat/completions", content=b"{nope", headers={**GOOD, "content-type":
                                                                              "application/json"})
    assert bad_json.status_code == 400 and bad_json.json()["error"]["type"] == "invalid_request_error"
    native_json = client.post("/v1/conversations/c/messages", content=b"{nope",
                              headers={**GOOD, "content-type": "application/json"})
    assert native_json.status_code == 422 and "type" not in native_json.json()["error"]


def test_unsupported_and_unknown_models_are_refused_before_anything_is_submitted(client: TestClient) -> None:
    tools = client.post("/v1/chat/completions", headers=GOOD, json={
        "model": "large", "messages": USER, "tools": [{"type": "web_search"}]})
    assert tools.status_code == 400 and tools.json()["error"]["param"] == "tools[0].type"
    unknown = client.post("/v1/chat/completions", headers=GOOD, json={"model": "gpt-9", "messages": USER})
    assert unknown.status_code == 404 and unknown.json()["error"]["code"] == "model_not_found"


def test_unknown_openai_routes_and_methods_answer_in_openai_shape(client: TestClient) -> None:
    for method, path in [("POST", "/v1/embeddings"), ("POST", "/v1/completions"), ("GET", "/v1/nothing")]:
        r = client.request(method, path, headers=GOOD, json={})
        assert r.status_code == 404 and set(r.json()["error"]) == {"message", "type", "param", "code"}, path
        assert path in r.json()["error"]["message"]
    wrong = client.delete("/v1/chat/completions", headers=GOOD)
    assert wrong.status_code == 405 and wrong.json()["error"]["code"] == "method_not_allowed"
    native = client.delete("/v1/usage", headers=GOOD)  # Parley's own route: the documented native shape
    assert native.status_code == 405 and native.json()["error"]["code"] == "method_not_allowed"
    assert set(native.json()["error"]) == {"code", "message"} and native.headers["allow"]
    missing = client.get("/v1/models/gpt-9", headers=GOOD)
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "model_not_found"
    assert client.get("/v1/models/small", headers=GOOD).json()["id"] == "small"


def test_models_answers_the_native_and_the_openai_shape(client: TestClient) -> None:
    body = client.get("/v1/models", headers=GOOD).json()
    assert body["default"] == "large" and body["items"][0] == {"pool": "large", "model": MODELS["large"]}
    assert body["object"] == "list" and {m["id"] for m in body["data"]} >= {"large", "small"}
