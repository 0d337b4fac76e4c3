"""One interface for both checks: score a text -> ``Verdict`` (flagged, category, score, rules version).

``EmbeddedClassifier`` is the default: the rules file's phrases and regular expressions first
(a match is final, score 1), then alt-profanity-check's linear model (shipped inside its wheel,
no download; ``profanity.py``) against the check's threshold. ``rule_verdict`` is shared with the model-pool
classifier (``pool_classifier.py``), so both apply the same rules the same way.
"""
from __future__ import annotations

import time
from typing import Any, Protocol

import msgspec

from infra.config.safety import Check, RulesFile, SafetyRules
from schemas import Block


class Verdict(msgspec.Struct, frozen=True, kw_only=True):
    flagged: bool
    category: str  # the rule's or model's category; "none" when nothing scored
    score: float  # 0..1
    rules_version: str
    source: str  # "rule", "model"
    seconds: float = 0.0  # how long the classifier took

    def block(self, check: Check) -> Block:
        return Block(check=check, category=self.category, score=round(self.score, 4), rules_version=self.rules_version)


class Classifier(Protocol):
    rules: RulesFile

    async def score(self, text: str, check: Check) -> Verdict: ...


def rule_verdict(rules: SafetyRules, text: str, check: Check) -> Verdict | None:
    for rule in rules.rules_for(check):
        if rule.pattern.search(text):
            return Verdict(flagged=True, category=rule.category, score=1.0, rules_version=rules.version,
                           source="rule")
    return None


class EmbeddedClassifier:
    """In-process: under a millisecond for a chunk on one CPU core, so it runs inline in the event loop."""

    def __init__(self, rules: RulesFile, model: Any = None) -> None:
        self.rules = rules
        if model is None:
            from consumers.safety.profanity import load_scorer

            model = load_scorer()
        self._predict = model

    async def score(self, text: str, check: Check) -> Verdict:
        return self.score_now(text, check)

    def score_now(self, text: str, check: Check) -> Verdict:
        began = time.perf_counter()
        rules = self.rules.current()
        found = rule_verdict(rules, text, check)
        if found is None:
            probability = float(self._predict([text])[0])
            found = Verdict(flagged=probability >= rules.thresholds[check], category=rules.model_category,
                            score=probability, rules_version=rules.version, source="model")
        return msgspec.structs.replace(found, seconds=time.perf_counter() - began)
