"""The classifier that asks a model pool, on a real vLLM engine serving the small pool (SmolLM2-135M,
CPU build), through the same interface and rules as the embedded classifier. No hub download."""
from __future__ import annotations

import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from consumers.generation.engine import VllmEngine
from consumers.safety.pool_classifier import PoolClassifier
from infra.config.safety import RulesFile
from infra.config.settings import Settings
from infra.local.model import ready_pool

pytest.importorskip("vllm")
pytestmark = pytest.mark.vllm
RULES = Path(__file__).with_name("data") / "safety.toml"


@pytest.fixture(scope="module")
async def engine() -> AsyncIterator[VllmEngine]:
    engine = VllmEngine(ready_pool("small", Settings.from_env()))
    yield engine
    await engine.close()


async def test_the_small_pool_answers_as_a_classifier(engine: VllmEngine) -> None:
    classifier = PoolClassifier(RulesFile(RULES), engine)
    texts = ["You are a worthless piece of garbage and everyone hates you.", "The tide comes in twice a day."]
    verdicts, times = [], []
    for text in texts * 3:
        began = time.perf_counter()
        verdicts.append(await classifier.score(text, "input"))
        times.append(time.perf_counter() - began)
    print(f"pool classifier (small pool, CPU): {', '.join(f'{t * 1000:.0f}' for t in times)} ms")
    assert all(v.source == "model" and v.rules_version == "it-1" for v in verdicts)
    assert all(v.category in ("unsafe", "unanswered") and v.score in (0.0, 1.0) for v in verdicts)
    assert all(v.flagged == (v.score >= 0.9) for v in verdicts)
    answers = [(v.flagged, v.category, v.score) for v in verdicts]
    assert answers[0] == answers[2] == answers[4] and answers[1] == answers[3]  # greedy: same text, same answer
    assert any(v.category == "unsafe" for v in verdicts)  # the model answered yes or no at least once


async def test_the_rules_decide_before_the_pool_is_asked(engine: VllmEngine) -> None:
    verdict = await PoolClassifier(RulesFile(RULES), engine).score("our solar system", "output")
    assert (verdict.flagged, verdict.category, verdict.source) == (True, "astronomy", "rule")
    assert verdict.seconds < 0.01  # no model call
