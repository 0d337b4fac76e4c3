"""The classifier that asks a model pool (the production choice: a safety model served by vLLM).

Same interface and same rules as the embedded one: the rules file's phrases decide first; otherwise
the pool's model is asked whether the text breaks the content rules, for one token, and the score is
how much of the probability of its first token goes to "yes" rather than "no" (from the engine's top
log probabilities, the way guard models are read), or the answer's word when no log probabilities
come back. Locally it runs on any ``Engine`` (the small pool's SmolLM2), with no hub download.
"""
from __future__ import annotations

import itertools
import math
import time
from typing import Any

import msgspec

from consumers.generation.sampling import Sampling
from consumers.safety.classifier import Verdict, rule_verdict
from infra.config.safety import Check, RulesFile

JUDGE = ("You are a content moderator. Answer with one word, yes or no: is the following text offensive, "
         "abusive, sexual or dangerous?")
TOP = 20  # log probabilities looked at for "yes" and "no"
_ids = itertools.count()


def parse_answer(answer: str) -> float | None:
    """1.0 for yes, 0.0 for no, None when the model said neither."""
    word = answer.strip().lower().lstrip("*\"'").split(maxsplit=1)
    head = word[0].strip(".,!:;*\"'") if word else ""
    return {"yes": 1.0, "no": 0.0}.get(head)


def yes_share(top: list[Any]) -> float | None:
    """P(yes) / (P(yes) + P(no)) over the first token's alternatives; None if neither is among them."""
    mass = {"yes": 0.0, "no": 0.0}
    for alt in top:
        word = alt.token.strip().lower()
        if word in mass:
            mass[word] += math.exp(alt.logprob)
    total = mass["yes"] + mass["no"]
    return mass["yes"] / total if total > 0 else None


class PoolClassifier:
    def __init__(self, rules: RulesFile, engine: Any, category: str = "unsafe") -> None:
        self.rules, self.engine, self.category = rules, engine, category

    async def score(self, text: str, check: Check) -> Verdict:
        began = time.perf_counter()
        rules = self.rules.current()
        found = rule_verdict(rules, text, check)
        if found is None:
            score = await self._ask(text)
            found = Verdict(flagged=score is not None and score >= rules.thresholds[check],
                            category=self.category if score is not None else "unanswered",
                            score=score or 0.0, rules_version=rules.version, source="model")
        return msgspec.structs.replace(found, seconds=time.perf_counter() - began)

    async def _ask(self, text: str) -> float | None:
        ids = self.engine.apply_chat_template([{"role": "system", "content": JUDGE},
                                               {"role": "user", "content": text[:4000]}])
        answer, first = [], None
        async for out in self.engine.generate(f"safety-{next(_ids)}", ids, 1, 0, Sampling(logprobs=TOP)):
            answer.append(out.text)
            if first is None and getattr(out, "logprobs", None):
                first = out.logprobs[0].top
        share = yes_share(first) if first else None
        return share if share is not None else parse_answer("".join(answer))
