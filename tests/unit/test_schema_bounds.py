"""Structured-output schemas and their regexes bounded before any engine compiles them (issue 30's inputs and
their relatives), and every numeric sampling field range-checked: each is a 400 naming the field."""
from __future__ import annotations

import time
from typing import Any

import pytest

from producers.gateway import openai_compat, regex_bounds, responses_compat, sampling_params, schema_bounds
from producers.gateway.sampling_params import CompatError
from producers.gateway.schema_bounds import SchemaTooCostly
from producers.gateway.submission import MAX_RECORD_BYTES, check_size
from schemas import MessageSubmitted
from schemas.gateway import ChatTurn

MODELS = {"large": "Smol", "small": "Smol"}


def nested(levels: int) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "string"}
    for _ in range(levels):
        schema = {"type": "object", "properties": {"a": schema}, "required": ["a"]}
    return schema


def json_schema(schema: dict[str, Any]) -> dict[str, Any]:
    return {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}}


@pytest.mark.parametrize("pattern", ["^(a|aa){1,5000}b$", "a{300}", "x{257,}", "(a+)+b", "(\\w+\\s?)*$",
                                     "((a|b){1,20}c){1,20}", "((((a{10}){10}){10}){2})", "[", "(" * 600 + ")" * 600,
                                     "a" * 1001])
def test_costly_or_unreadable_patterns_are_refused(pattern: str) -> None:
    with pytest.raises(regex_bounds.TooCostly):
        regex_bounds.check(pattern)


@pytest.mark.parametrize("pattern", ["^[a-z]{1,256}$", "^(a|aa){1,256}b$", "^\\d{3}-\\d{4}$", "(\\d{3}-)+\\d+",
                                     "^(?<year>\\d{4})-(?<month>\\d{2})$", "^(ab?)+$", "^[A-Z][a-z]*( [A-Z][a-z]*)?$"])
def test_ordinary_patterns_pass(pattern: str) -> None:
    assert 0 < regex_bounds.check(pattern) <= regex_bounds.MAX_UNROLLED


def test_the_issue_regex_is_refused_in_well_under_a_millisecond_per_check() -> None:
    schema = {"type": "string", "pattern": "^(a|aa){1,5000}b$"}
    start = time.perf_counter()
    for _ in range(100):
        with pytest.raises(SchemaTooCostly) as caught:
            schema_bounds.check(schema)
    assert (time.perf_counter() - start) / 100 < 0.005
    assert caught.value.where == "pattern" and "5,000" in str(caught.value)


@pytest.mark.parametrize(("schema", "where", "words"), [
    (nested(40), "properties.a.properties", "nested 65 levels"),  # 81 JSON levels: the 65th is refused
    (nested(150), "properties.a.properties", "nested 65 levels"),
    ({"type": "object", "properties": {f"p{i}": {"type": "integer"} for i in range(1000)}}, "", "values"),
    ({"type": "string", "maxLength": 101}, "maxLength", "length bounds"),
    ({"type": "object", "properties": {f"p{i}": {"type": "string", "maxLength": 30 + i} for i in range(4)}},
     "properties.p", "length bounds"),
    ({"type": "array", "items": {"type": "string"}, "maxItems": -1}, "maxItems", "whole number"),
    ({"type": "integer", "maximum": 1 << 64}, "maximum", "64-bit"),
    ({"type": "object", "patternProperties": {"^(a+)+$": {"type": "string"}}}, "patternProperties.^(a+)+$", "nests"),
    ({"type": "object", "properties": {"p": {"type": "string", "pattern": "a{1,200}b{1,200}" * 3}},
      "required": ["p"]}, "properties.p.pattern", "unrolls"),
])
def test_schemas_past_a_limit_name_where(schema: dict[str, Any], where: str, words: str) -> None:
    with pytest.raises(SchemaTooCostly) as caught:
        schema_bounds.check(schema)
    assert caught.value.where.startswith(where) and words in str(caught.value)


def test_ordinary_schemas_pass_and_keyword_names_as_properties_are_not_keywords() -> None:
    schema = {"type": "object", "required": ["pattern", "maxLength"], "properties": {
        "pattern": {"type": "string", "pattern": "^[a-z]+$"}, "maxLength": {"type": "integer", "maximum": 10},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 40}, "maxItems": 100},
        "kind": {"enum": [{"pattern": "(a+)+"}], "default": {"maxLength": -1}}},
        "$defs": {"minLength": {"type": "string", "minLength": 2}}}
    schema_bounds.check(schema)
    schema_bounds.check(nested(30))


def test_a_costly_schema_is_a_400_naming_the_field_on_both_openai_dialects() -> None:
    body = {"model": "large", "messages": [{"role": "user", "content": "hi"}],
            **json_schema({"type": "string", "pattern": "^(a|aa){1,5000}b$"})}
    with pytest.raises(CompatError) as chat:
        openai_compat.parse(body, MODELS, "large", 1000)
    assert chat.value.status == 400 and chat.value.code == "schema_too_costly"
    assert chat.value.param == "response_format.json_schema.schema.pattern"
    with pytest.raises(CompatError) as resp:
        responses_compat.parse({"model": "large", "input": "hi", "text": {"format": {
            "type": "json_schema", "name": "x", "schema": nested(150)}}}, MODELS, "large", 1000)
    assert resp.value.status == 400 and resp.value.code == "schema_too_costly"
    assert resp.value.param is not None and resp.value.param.startswith("text.format.schema.properties")


BIG = 1 << 64


@pytest.mark.parametrize(("field", "value"), [
    ("max_tokens", BIG), ("max_completion_tokens", BIG), ("max_tokens", 0), ("n", BIG), ("top_logprobs", BIG),
    ("seed", BIG), ("seed", -BIG), ("temperature", 10**400), ("top_p", BIG), ("presence_penalty", -BIG),
    ("frequency_penalty", BIG), ("repetition_penalty", BIG), ("top_k", BIG), ("min_p", BIG), ("min_tokens", BIG),
    ("temperature", float("inf")), ("max_tokens", 1.5), ("n", True)])
def test_chat_numbers_out_of_range_are_400_naming_the_parameter(field: str, value: Any) -> None:
    body = {"model": "large", "messages": [{"role": "user", "content": "hi"}], field: value}
    if field == "top_logprobs":
        body["logprobs"] = True
    with pytest.raises(CompatError) as caught:
        openai_compat.parse(body, MODELS, "large", 1000)
    assert caught.value.status == 400 and caught.value.param == field
    assert len(caught.value.message) < 200  # a 400-digit number is described, not echoed


@pytest.mark.parametrize(("field", "value"), [("max_output_tokens", BIG), ("max_output_tokens", (1 << 20) + 1),
                                              ("top_logprobs", BIG), ("temperature", -BIG), ("top_p", 10**400)])
def test_responses_numbers_out_of_range_are_400_naming_the_parameter(field: str, value: Any) -> None:
    with pytest.raises(CompatError) as caught:
        responses_compat.parse({"model": "large", "input": "hi", field: value}, MODELS, "large", 1000)
    assert caught.value.status == 400 and caught.value.param == field


def test_the_largest_values_in_range_are_accepted() -> None:
    parsed = sampling_params.parse({"seed": (1 << 63) - 1, "top_k": 1 << 20, "top_logprobs": 20, "logprobs": True})
    assert parsed.sampling is not None and parsed.sampling.seed == (1 << 63) - 1
    assert sampling_params.reply_cap({"max_tokens": 1 << 20}, "max_tokens") == 1 << 20


def _request(history: list[ChatTurn]) -> MessageSubmitted:
    return MessageSubmitted(generation_id="g", conversation_id="c", user_id="u", plan="free", message_id="m",
                            client_message_id="x", content="hi", history=history)


def test_a_request_over_kafkas_record_limit_is_a_413_that_says_so() -> None:
    check_size(_request([ChatTurn("user", "abcd")] * 1000), "u")
    with pytest.raises(sampling_params.ApiError) as caught:
        check_size(_request([ChatTurn("user", "abcd")] * 40_000), "u")
    assert caught.value.status == 413 and caught.value.code == "request_too_large"
    assert f"{MAX_RECORD_BYTES:,}" in caught.value.message
    status, body = openai_compat.error_json(caught.value)
    assert status == 413 and body["error"]["code"] == "request_too_large"


def test_kafkas_own_size_refusal_is_413_never_503_with_retry_after() -> None:
    from aiokafka.errors import MessageSizeTooLargeError
    from fastapi import FastAPI
    from fastapi.testclient import TestClient

    from producers.gateway.app import install_error_handlers

    app = FastAPI()
    install_error_handlers(app)

    @app.post("/v1/chat/completions")
    @app.post("/v1/conversations/c/messages")
    async def produce() -> None:
        raise MessageSizeTooLargeError("The message is 2000000 bytes when serialized")

    client = TestClient(app)
    openai = client.post("/v1/chat/completions")
    assert openai.status_code == 413 and openai.json()["error"]["code"] == "request_too_large"
    native = client.post("/v1/conversations/c/messages")
    assert native.status_code == 413 and native.json()["error"]["code"] == "request_too_large"
    assert "too large for one Kafka record" in native.json()["error"]["message"]
    assert "retry-after" not in native.headers
