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
from tests.tools import needs_engine

needs_engine()
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
    # "yes" and "no" are among the first token's likeliest alternatives: every text gets a share, 0..1.
    assert all(v.category == "unsafe" and 0.0 <= v.score <= 1.0 for v in verdicts), verdicts
    assert all(v.flagged == (v.score >= 0.9) for v in verdicts)
    scores = [round(v.score, 4) for v in verdicts]
    assert scores[0] == scores[2] == scores[4] and scores[1] == scores[3]  # greedy and exact: same text, same score
    # No assertion on the judgement itself: a 135M chat model is no safety model (its yes/no shares sit
    # near one half either way); this exercises the interface, the engine path and the latency.

async def test_the_rules_decide_before_the_pool_is_asked(engine: VllmEngine) -> None:
    verdict = await PoolClassifier(RulesFile(RULES), engine).score("our solar system", "output")
    assert (verdict.flagged, verdict.category, verdict.source) == (True, "astronomy", "rule")
    assert verdict.seconds < 0.01  # no model call
