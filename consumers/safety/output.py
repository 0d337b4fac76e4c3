"""The output check, run by the generation worker beside its engine loop.

A reply is cut into chunks: a chunk ends where a sentence ends (or a line), after the plan's
``chunk_tokens``, or at the reply's end. Each finished chunk is classified together with the tail
of the one before, so a phrase split across two chunks is still seen. With hold-back 0 every step
is appended at once and checked after; with hold-back 1 the steps of a chunk are held until the
chunk has passed, so a flagged sentence is never shown at all.

``OutputGuard`` is the pure per-reply state; ``OutputCheck`` adds the classifier and metrics.
"""
from __future__ import annotations

import logging
import re
from typing import Any

from consumers.safety.classifier import Classifier, Verdict
from consumers.safety.metrics import SafetyMetrics
from infra.config.safety import PlanPolicy
from infra.stores import keys
from schemas import GenerationRequested, GenerationRetracted
from topics.clients import send

log = logging.getLogger(__name__)

# A sentence ends in a step's text: at its end, or inside it when the engine handed over several tokens at once
# (the worker takes a window of them at its flush tick), so a chunk still ends at the first sentence end.
SENTENCE_BREAK = re.compile(r"[.!?…][\"')\]*_]*(?:\s|$)|\n")
OVERLAP_CHARS = 80  # of the previous chunk, classified again with the next one


class OutputGuard:
    def __init__(self, policy: PlanPolicy) -> None:
        self.policy = policy
        self.text: list[str] = []
        self.tokens = 0
        self.previous = ""
        self.held: list[Any] = []
        self.chunks = 0

    @property
    def holds(self) -> bool:
        return self.policy.hold_back_sentences > 0

    def hold(self, event: Any) -> None:
        self.held.append(event)

    def add(self, text: str, tokens: int, final: bool) -> bool:
        """Take one hand-over's text (one or several tokens); True when the chunk it completes (or passes) should
        be classified now."""
        self.text.append(text)
        self.tokens += tokens
        if not self.tokens and not "".join(self.text).strip():
            return False
        return final or self.tokens >= self.policy.chunk_tokens or bool(SENTENCE_BREAK.search(text))

    def window(self) -> str:
        return self.previous[-OVERLAP_CHARS:] + "".join(self.text)

    def passed(self) -> list[Any]:
        """The chunk was clean: start the next one; returns the held steps, now free to show."""
        self.previous, self.text, self.tokens, self.chunks = "".join(self.text), [], 0, self.chunks + 1
        held, self.held = self.held, []
        return held


class OutputCheck:
    def __init__(self, classifier: Classifier, metrics: SafetyMetrics) -> None:
        self.classifier, self.metrics = classifier, metrics

    def start(self, plan: str, purpose: str) -> OutputGuard | None:
        """A guard for one reply, or None where the plan's policy turns the check off (and for the
        service's own titles and summaries, which nobody watches stream)."""
        policy = self.classifier.rules.current().policy(plan)
        return OutputGuard(policy) if policy.output_check and purpose == "reply" else None

    async def check(self, guard: OutputGuard, req: GenerationRequested) -> Verdict:
        verdict = await self.classifier.score(guard.window(), "output")
        self.metrics.observe("output", req.plan, verdict)
        if verdict.flagged:
            log.info("generation %s blocked by the output check: %s score %.3f, rules %s, chunk %d, %.1f ms",
                     req.generation_id, verdict.category, verdict.score, verdict.rules_version, guard.chunks,
                     verdict.seconds * 1000)
        return verdict

    async def retract(self, producer: Any, redis: Any, tokens_topic: str, req: GenerationRequested,
                      verdict: Verdict, shown: int) -> str:
        """Mark the generation retracted (delivery skips its text on every later replay), then tell the
        readers that are following it now; returns the notice that replaces the text."""
        notice = self.classifier.rules.current().notice("output")
        await redis.set(keys.generation_retracted(req.generation_id), shown, ex=keys.RETRACTED_TTL_S)
        await send(producer, tokens_topic, GenerationRetracted(
            generation_id=req.generation_id, conversation_id=req.conversation_id, user_id=req.user_id,
            last_seq=shown, block=verdict.block("output"), notice=notice), key=req.generation_id)
        return notice
