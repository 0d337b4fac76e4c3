"""The classifier that asks a model pool (the production choice: a safety model served by vLLM).

Same interface and same rules as the embedded one: the rules file's phrases decide first; otherwise
the pool's model is asked, greedily, whether the text breaks the content rules, and its yes/no is
the score. Locally it runs on any ``Engine`` (the small pool's SmolLM2), with no hub download.
"""
from __future__ import annotations

import itertools
import time
from typing import Any

import msgspec

from consumers.generation.engine import GREEDY
from consumers.safety.classifier import Verdict, rule_verdict
from infra.config.safety import Check, RulesFile

JUDGE = ("You are a content moderator. Answer with one word, yes or no: is the following text offensive, "
         "abusive, sexual or dangerous?")
_ids = itertools.count()


def parse_answer(answer: str) -> float | None:
    """1.0 for yes, 0.0 for no, None when the model said neither."""
    word = answer.strip().lower().lstrip("*\"'").split(maxsplit=1)
    head = word[0].strip(".,!:;*\"'") if word else ""
    return {"yes": 1.0, "no": 0.0}.get(head)


class PoolClassifier:
    def __init__(self, rules: RulesFile, engine: Any, category: str = "unsafe") -> None:
        self.rules, self.engine, self.category = rules, engine, category

    async def score(self, text: str, check: Check) -> Verdict:
        began = time.perf_counter()
        rules = self.rules.current()
        found = rule_verdict(rules, text, check)
        if found is None:
            ids = self.engine.apply_chat_template([{"role": "system", "content": JUDGE},
                                                   {"role": "user", "content": text[:4000]}])
            answer = []
            async for out in self.engine.generate(f"safety-{next(_ids)}", ids, 3, 0, GREEDY):
                answer.append(out.text)
            score = parse_answer("".join(answer))
            found = Verdict(flagged=score is not None and score >= rules.thresholds[check],
                            category=self.category if score is not None else "unanswered",
                            score=score or 0.0, rules_version=rules.version, source="model")
        return msgspec.structs.replace(found, seconds=time.perf_counter() - began)
