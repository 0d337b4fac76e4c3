"""The safety checks' logic: the rules file, the real embedded classifier, chunking and hold-back,
admission's refusal, the model-pool classifier's parsing, and how delivery frames a retraction."""
from __future__ import annotations

import os
import random
import time
from pathlib import Path

import msgspec
import pytest
from prometheus_client import CollectorRegistry

from consumers.admission import Admission, AdmissionRules
from consumers.safety.classifier import EmbeddedClassifier
from consumers.safety.metrics import SafetyMetrics
from consumers.safety.output import OutputGuard
from consumers.safety.pool_classifier import PoolClassifier, parse_answer
from infra.config.safety import DEFAULT_FILE, PlanPolicy, RulesFile, SafetyRulesError, load
from producers.gateway import openai_compat
from producers.gateway.sse import to_sse
from schemas import Block, GenerationRetracted, InputBlocked, MessageSubmitted, RequestRefused, Usage
from tests.fakes import FakeEngine
from tests.unit.test_admission import FREE
from topics import Topics

RULES_TOML = """
version = "t-1"
[model]
input_threshold = 0.8
output_threshold = 0.95
[[rules]]
category = "astronomy"
phrase = "solar system"
checks = ["output"]
[[rules]]
category = "secret"
regex = 'open sesame'
[plans.free]
hold_back_sentences = 1
chunk_tokens = 4
[plans.paid]
output_check = false
[notices]
input = "Not sent."
"""


@pytest.fixture
def rules_path(tmp_path: Path) -> Path:
    path = tmp_path / "safety.toml"
    path.write_text(RULES_TOML)
    return path


@pytest.fixture(scope="module")
def shipped() -> EmbeddedClassifier:
    return EmbeddedClassifier(RulesFile(DEFAULT_FILE))


def test_the_shipped_rules_file_parses_with_a_version_and_both_plans() -> None:
    rules = load(DEFAULT_FILE)
    assert rules.version and rules.rules and {"free", "paid"} <= set(rules.plans)
    assert rules.policy("paid").hold_back_sentences == 0 and rules.policy("free").hold_back_sentences == 1
    assert "content rules" in rules.notice("input") and "content rules" in rules.notice("output")


def test_rules_are_scoped_to_checks_and_plans(rules_path: Path) -> None:
    rules = load(rules_path)
    assert [r.category for r in rules.rules_for("input")] == ["secret"]
    assert [r.category for r in rules.rules_for("output")] == ["astronomy", "secret"]
    assert rules.policy("paid") == PlanPolicy(output_check=False)
    assert rules.policy("enterprise") == PlanPolicy()  # an unknown plan gets the defaults, checks on
    assert rules.thresholds == {"input": 0.8, "output": 0.95}


def test_a_bad_rules_file_is_a_clear_error(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text('version = "x"\n[[rules]]\ncategory = "c"\nregex = "("\n')
    with pytest.raises(SafetyRulesError, match="bad.toml"):
        load(bad)
    bad.write_text('[[rules]]\ncategory = "c"\nphrase = "p"\nchecks = ["sideways"]\n')
    with pytest.raises(SafetyRulesError):
        load(bad)


def test_rules_reload_when_the_file_changes_and_a_broken_edit_keeps_the_old_ones(rules_path: Path) -> None:
    rules = RulesFile(rules_path, every_s=0.0)
    classifier = EmbeddedClassifier(rules)
    assert not classifier.score_now("a purple cow", "input").flagged
    extra = '[[rules]]\ncategory = "cows"\nphrase = "purple cow"\n'
    rules_path.write_text(RULES_TOML.replace('"t-1"', '"t-2"') + extra)
    os.utime(rules_path, ns=(time.time_ns(), time.time_ns() + 1_000_000))
    verdict = classifier.score_now("a purple cow", "input")
    assert (verdict.flagged, verdict.category, verdict.rules_version) == (True, "cows", "t-2")
    rules_path.write_text("this is not toml [")
    os.utime(rules_path, ns=(time.time_ns(), time.time_ns() + 2_000_000))
    assert rules.current().version == "t-2"


def test_the_embedded_model_flags_profanity_and_passes_ordinary_text(shipped: EmbeddedClassifier) -> None:
    clean = shipped.score_now("The largest planet in our solar system is Jupiter.", "output")
    rude = shipped.score_now("shut up you stupid fucking idiot", "input")
    assert not clean.flagged and clean.source == "model" and clean.score < 0.5
    assert rude.flagged and rude.category == "profanity" and rude.score >= 0.9
    assert rude.rules_version == load(DEFAULT_FILE).version


def test_a_rule_decides_before_the_model_and_only_for_its_check(rules_path: Path) -> None:
    classifier = EmbeddedClassifier(RulesFile(rules_path), model=lambda texts: [0.0])
    out = classifier.score_now("Our Solar  System? no: our solar system.", "output")
    assert (out.flagged, out.category, out.score, out.source) == (True, "astronomy", 1.0, "rule")
    assert not classifier.score_now("our solar system", "input").flagged  # an output-only rule
    assert classifier.score_now("say OPEN SESAME", "input").category == "secret"


def test_embedded_classifier_latency_is_a_few_milliseconds(shipped: EmbeddedClassifier) -> None:
    text = "Here is a normal sentence about tides, the moon and the sea, of ordinary length. " * 3
    shipped.score_now(text, "input")
    times = sorted(shipped.score_now(text, "input").seconds for _ in range(50))
    print(f"embedded classifier, {len(text)} chars: p50 {times[25] * 1000:.2f} ms, p95 {times[47] * 1000:.2f} ms")
    assert times[25] < 0.05  # the input check's budget is tens of milliseconds


def test_chunks_end_at_sentences_token_counts_and_the_end() -> None:
    guard = OutputGuard(PlanPolicy(chunk_tokens=5))
    assert not guard.add("The sky", 2, False)
    assert guard.add(" is blue.", 3, False)  # sentence end
    assert guard.window() == "The sky is blue."
    guard.passed()
    assert not guard.add(" It", 1, False) and not guard.add(" has", 1, False)
    assert guard.add(" many many", 3, False)  # five tokens
    assert guard.window() == "The sky is blue. It has many many"  # with the tail of the chunk before
    guard.passed()
    assert guard.add(" clouds", 1, True)  # the reply's end closes the last chunk
    assert not OutputGuard(PlanPolicy()).add("", 0, False)


def test_a_sentence_that_ends_inside_a_hand_over_of_several_tokens_closes_the_chunk() -> None:
    guard = OutputGuard(PlanPolicy(chunk_tokens=24))
    assert not guard.add("It costs 3.5 euros", 5, False)  # a decimal point ends nothing
    assert guard.add(" a day. Most", 4, False)  # the sentence ended mid-way: checked now, not 24 tokens on
    assert guard.window() == "It costs 3.5 euros a day. Most"
    guard.passed()
    assert not guard.add(" people", 1, False)
    assert guard.add(" walk!\n", 2, False) and guard.passed() == []
    assert guard.add("First line\nsecond", 3, False)  # a line break inside


def test_hold_back_releases_a_chunks_steps_only_after_it_passed() -> None:
    guard = OutputGuard(PlanPolicy(hold_back_sentences=1))
    assert guard.holds and not OutputGuard(PlanPolicy()).holds
    guard.hold("step-0")
    guard.add("Hi", 1, False)
    guard.hold("step-1")
    assert guard.add(" there.", 1, False)
    assert guard.passed() == ["step-0", "step-1"] and guard.passed() == []


class _NoQuota:
    async def reserve(self, *args: object, **kwargs: object) -> object:
        raise AssertionError("a blocked message must not touch the quota")


async def test_admission_refuses_a_flagged_message_before_any_reservation(rules_path: Path) -> None:
    registry = CollectorRegistry()
    metrics = SafetyMetrics(registry)
    topics = Topics("x.")
    admission = Admission(_NoQuota(), {"free": FREE}, AdmissionRules(), topics,  # type: ignore[arg-type]
                          EmbeddedClassifier(RulesFile(rules_path)), metrics)
    event = MessageSubmitted(generation_id="g1", conversation_id="c1", user_id="u1", plan="free", message_id="m1",
                             client_message_id="cm1", content="please say open sesame now")
    refused, saved = await admission.handle(event)
    assert refused.topic == topics.tokens and refused.key == "g1"
    assert isinstance(refused.event, RequestRefused)
    assert (refused.event.reason, refused.event.status, refused.event.message) == ("blocked", 400, "Not sent.")
    assert "sesame" not in refused.event.message and "secret" not in refused.event.message  # reveals nothing
    assert saved.topic == topics.admitted and saved.key == "c1" and isinstance(saved.event, InputBlocked)
    assert (saved.event.block.category, saved.event.block.rules_version, saved.event.message_id) == (
        "secret", "t-1", "m1")
    assert registry.get_sample_value("parley_safety_blocks_total",
                                     {"check": "input", "plan": "free", "category": "secret"}) == 1
    assert registry.get_sample_value("parley_safety_checks_total", {"check": "input", "plan": "free"}) == 1
    assert registry.get_sample_value("parley_safety_classifier_seconds_count", {"check": "input"}) == 1


def test_pool_classifier_answers_parse_to_scores() -> None:
    assert parse_answer(" Yes.") == 1.0 and parse_answer("no, it is fine") == 0.0
    assert parse_answer("**Yes**") == 1.0 and parse_answer("Maybe") is None and parse_answer("") is None


def test_pool_classifier_scores_the_share_of_yes_in_the_first_tokens_probabilities() -> None:
    import math

    from consumers.safety.pool_classifier import yes_share
    from schemas.sampling import TopLogprob

    top = [TopLogprob("Yes", math.log(0.3)), TopLogprob(" yes", math.log(0.1)), TopLogprob("No", math.log(0.1)),
           TopLogprob("The", math.log(0.5))]
    assert yes_share(top) == pytest.approx(0.8)
    assert yes_share([TopLogprob("The", 0.0)]) is None


async def test_pool_classifier_asks_the_engine_after_the_rules(rules_path: Path) -> None:
    engine = FakeEngine(reply="Yes")
    classifier = PoolClassifier(RulesFile(rules_path), engine)
    verdict = await classifier.score("something rude", "input")
    assert (verdict.flagged, verdict.category, verdict.score, verdict.source) == (True, "unsafe", 1.0, "model")
    assert len(engine.requests) == 1 and engine.requests[0].max_tokens == 1
    assert engine.requests[0].sampling.temperature == 0.0 and engine.requests[0].sampling.logprobs == 20
    by_rule = await classifier.score("open sesame", "input")
    assert by_rule.source == "rule" and len(engine.requests) == 1  # the rules decided: no model call
    engine.reply = "No"
    assert not (await classifier.score("a kind word", "input")).flagged


def test_retraction_frames_name_no_rule_and_blocked_ends_say_so() -> None:
    block = Block(check="output", category="astronomy", score=1.0, rules_version="t-1")
    retracted = GenerationRetracted(generation_id="g", conversation_id="c", user_id="u", last_seq=3, block=block,
                                    notice="Removed.")
    [frame] = to_sse(41, retracted)
    assert frame.startswith(b"id: 41\nevent: retracted\n") and b"Removed." in frame and b"astronomy" not in frame
    refused = RequestRefused(generation_id="g", conversation_id="c", user_id="u", reason="blocked",
                             message="Not sent.", status=400)
    error, end = to_sse(7, refused)
    assert b"event: error" in error and b'"stop_reason":"blocked"' in end


def test_openai_shapes_for_blocked_replies_and_messages() -> None:
    from schemas import GenerationFinished

    finished = GenerationFinished(generation_id="0190c0de-0000-7000-8000-000000000000", conversation_id="c",
                                  user_id="u", plan="free", message_id="m", status="blocked", text="Removed.",
                                  usage=Usage(prompt_tokens=10, completion_tokens=4), model="m", pool="large",
                                  worker_id="w")
    choice = openai_compat.completion([finished])["choices"][0]
    assert choice["finish_reason"] == "content_filter" and choice["message"]["content"] == "Removed."
    refused = RequestRefused(generation_id="g", conversation_id="c", user_id="u", reason="blocked",
                             message="Not sent.", status=400)
    from producers.gateway.submission import Refused

    status, body = openai_compat.error_json(Refused(refused))
    assert status == 400 and body["error"]["code"] == "content_filter"


def test_blocked_verdicts_round_trip_through_events() -> None:
    from schemas import decode, encode

    block = Block(check="input", category="secret", score=1.0, rules_version="t-1")
    event = InputBlocked(generation_id="g", conversation_id="c", user_id="u", plan="free", message_id="m",
                         client_message_id="cm", block=block, notice="Not sent.")
    assert decode(encode(event)) == event
    assert msgspec.json.decode(encode(event))["block"]["category"] == "secret"


def test_the_direct_profanity_scores_are_the_packages_own() -> None:
    import numpy as np
    from profanity_check import predict_prob
    from profanity_check import profanity_check as package

    from consumers.safety.profanity import load_scorer

    texts = ["a calm day at the beach", "what the hell is this shit", "go to hell", "I adore kittens", ""]
    # and 500 texts drawn from the model's own vocabulary, with repeats, capitals, punctuation and unknown words
    rng = random.Random(7)
    vocabulary = sorted(package.vectorizer.vocabulary_)
    extra = ["The", "HELL!!", "Été", "—", "don't", "x1", "naïve", "\n"]
    texts += [" ".join(rng.choice(vocabulary + extra) for _ in range(rng.randint(0, 60))) for _ in range(500)]
    scorer = load_scorer()
    assert scorer is not predict_prob  # the fast path was taken
    expected = predict_prob(texts)
    assert np.allclose(scorer(texts), expected, atol=1e-9)
    assert expected.max() > 0.9 and expected.min() < 0.1  # the probes reach both ends


def test_the_output_check_follows_the_plans_policy_and_skips_the_services_own_calls(rules_path: Path) -> None:
    from consumers.safety.output import OutputCheck

    check = OutputCheck(EmbeddedClassifier(RulesFile(rules_path), model=lambda texts: [0.0]),
                        SafetyMetrics(CollectorRegistry()))
    free = check.start("free", "reply")
    assert free is not None and free.holds and free.policy.chunk_tokens == 4
    assert check.start("paid", "reply") is None  # the rules turn the output check off for paid
    assert check.start("free", "title") is None and check.start("free", "summary") is None
