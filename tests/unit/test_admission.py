"""Admission's pure decision: input check, routing, and what a quota answer becomes."""
from __future__ import annotations

from dataclasses import replace

import msgspec
import pytest

from consumers.admission import (
    AdmissionRules,
    decide,
    estimate_prompt,
    precheck,
    reply_cap,
    route,
    visible_chars,
)
from infra.config.plans import Plan
from infra.config.settings import Settings
from infra.stores.quota_outcomes import Refusal, Reservation, refusal
from schemas import MessageSubmitted, RequestAdmitted, RequestRefused
from topics import Topics

TOPICS = Topics("x.")
RULES = AdmissionRules()
FREE = Plan("free", daily_tokens=30_000, bucket_tokens_per_minute=6_000, bucket_burst=12_000, max_running=2,
            reply_cap=512, queue_wait_limit_s=10, lane="free")


def submitted(content: str = "Hello there", **changes: object) -> MessageSubmitted:
    base = MessageSubmitted(generation_id="g1", conversation_id="c1", user_id="u1", plan="free", message_id="m1",
                            client_message_id="cm1", content=content)
    return msgspec.structs.replace(base, **changes)


def reservation(state: str = "admitted", amount: int = 1_516) -> Reservation:
    return Reservation(generation_id="g1", user_id="u1", plan="free", day="2025-01-02", amount=amount,
                       prompt_tokens=amount - 512, reply_cap=512, conversation_id="c1", created_at=1.0,
                       expires_at=301.0, state=state)  # type: ignore[arg-type]


def test_admitted_goes_to_admitted_topic_keyed_by_conversation_with_reservation() -> None:
    [out] = decide(submitted(), reservation(amount=1_516), RULES, TOPICS)
    assert out.topic == TOPICS.admitted and out.key == "c1"
    assert isinstance(out.event, RequestAdmitted)
    assert (out.event.reserved_tokens, out.event.reply_cap, out.event.pool, out.event.route_reason) == (
        1_516, 512, "large", "default")
    assert out.event.content == "Hello there" and out.event.client_message_id == "cm1"


def test_refusal_goes_to_tokens_keyed_by_generation_with_retry_after() -> None:
    refused = Refusal("rate_limit", "Per-minute limit reached — try again in 7 s", retry_after_s=7.0)
    [out] = decide(submitted(), refused, RULES, TOPICS)
    assert out.topic == TOPICS.tokens and out.key == "g1"
    assert isinstance(out.event, RequestRefused)
    assert (out.event.reason, out.event.status, out.event.retry_after_s) == ("rate_limit", 429, 7.0)
    assert "try again in 7 s" in out.event.message


def test_redelivered_request_is_admitted_again_but_a_settled_one_is_not() -> None:
    assert len(decide(submitted(), reservation("existing"), RULES, TOPICS)) == 1
    assert decide(submitted(), reservation("settled"), RULES, TOPICS) == []


@pytest.mark.parametrize("content", ["", "   \n\t", "\x00\x01\x1b", "\u200b\u200e"])
def test_empty_or_control_only_content_is_refused_with_422(content: str) -> None:
    refused = precheck(submitted(content), RULES)
    assert refused is not None and (refused.reason, refused.status) == ("invalid", 422)
    assert refused.retry_after_s is None


def test_too_long_is_413_and_unknown_pool_is_422_and_normal_text_passes() -> None:
    rules = replace(RULES, max_message_chars=10)
    too_long = precheck(submitted("x" * 11), rules)
    assert too_long is not None and (too_long.reason, too_long.status) == ("too_long", 413)
    bad_pool = precheck(submitted(pool="huge"), RULES)
    assert bad_pool is not None and bad_pool.status == 422 and "huge" in bad_pool.message
    assert precheck(submitted("  ok\x00 "), RULES) is None
    assert visible_chars("a\x00 b\u200b") == 2


def test_route_requested_beats_classifier_and_classifier_is_off_by_default() -> None:
    assert route(submitted("hi"), RULES) == ("large", "default")
    on = replace(RULES, route_small_max_chars=20)
    assert route(submitted("hi"), on) == ("small", "classifier")
    assert route(submitted("x" * 21), on) == ("large", "default")
    assert route(submitted("```a```"), on) == ("large", "default")  # code is not "simple"
    assert route(submitted("hi", pool="large"), on) == ("large", "requested")
    [out] = decide(submitted("hi"), reservation(), on, TOPICS)
    assert (out.event.pool, out.event.route_reason) == ("small", "classifier")  # type: ignore[attr-defined]


def test_classifier_configured_from_environment() -> None:
    rules = AdmissionRules.from_settings(Settings.from_env({"PARLEY_ROUTE_SMALL_MAX_CHARS": "80"}), ["large"])
    assert rules.route_small_max_chars == 80 and rules.pools == ("large",)
    assert AdmissionRules.from_settings(Settings.from_env({}), ["large"]).route_small_max_chars is None


def test_unknown_pool_is_refused_with_the_configured_ones() -> None:
    rules = AdmissionRules(pools=("tiny", "huge"))
    refused = precheck(submitted("hi", pool="large"), rules)
    assert refused is not None and refused.status == 422 and "tiny, huge" in refused.message
    assert precheck(submitted("hi", pool="tiny"), rules) is None


def test_estimate_grows_with_length_and_reply_cap_respects_max_tokens() -> None:
    short, long = estimate_prompt(submitted("a" * 30), RULES), estimate_prompt(submitted("a" * 3_000), RULES)
    assert short == 11 + RULES.history_allowance and long - short == 990
    assert reply_cap(submitted(), FREE) == 512
    assert reply_cap(submitted(max_tokens=100), FREE) == 100
    assert reply_cap(submitted(max_tokens=5_000), FREE) == 512


def test_refusal_messages_name_the_limit_and_the_reset() -> None:
    now = 1_735_689_600.0 + 3_600  # 2025-01-01 01:00 UTC
    daily = refusal(FREE, "daily_budget", "29000", "", 3_800, now, 5.0)
    assert daily.message.startswith("Not enough left today for a full reply: 1,000 of your 30,000 daily tokens")
    assert "resets at 00:00 UTC" in daily.message and "needs up to 3,800" in daily.message
    assert "reached" not in daily.message  # tokens remain: the limit is not reached
    spent = refusal(FREE, "daily_budget", "30000", "", 3_800, now, 5.0)
    assert spent.message == "Daily limit of 30,000 tokens reached — resets at 00:00 UTC"
    assert daily.retry_after_s == 23 * 3_600
    rate = refusal(FREE, "rate_limit", "800", "", 3_800, now, 5.0)
    assert rate.retry_after_s == 30 and "6,000 tokens" in rate.message  # (3,800 - 800) / 100 per s
    busy = refusal(FREE, "concurrency", "2", str(now + 240), 3_800, now, 5.0)
    assert busy.retry_after_s == 5 and "2 replies" in busy.message
