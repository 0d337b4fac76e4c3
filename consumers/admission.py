"""Admission stage (group ``admission``): ``MessageSubmitted`` on ``chat.requests`` ->
``RequestAdmitted`` on ``chat.admitted`` (keyed by conversation) or ``RequestRefused``
on ``chat.tokens`` (keyed by generation, where the gateway waits for it).

Checks the input (size, visible text, then the safety classifier: a flagged message is
refused with 400 and handed to the prompt build as ``InputBlocked`` to be saved, before any
budget is touched), picks the pool, and reserves prompt estimate + reply cap with one
atomic Redis script (``infra/stores/quota.py``). The decision is pure (``precheck``,
``route``, ``decide``); the handler only calls the quota between them. A
redelivered request finds its reservation and is admitted again identically; one
already settled is not admitted again (it would generate twice).
"""
from __future__ import annotations

import logging
import time
import unicodedata
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from prometheus_client import Counter

from consumers.deadlines import past_deadline
from consumers.safety.classifier import Classifier, Verdict
from consumers.safety.metrics import SafetyMetrics
from consumers.stage import Out, Stage
from infra.config.plans import Plan
from infra.config.settings import Settings
from infra.stores.quota import Quota
from infra.stores.quota_outcomes import Refusal, Reservation
from infra.stores.sealing import Sealer
from schemas import InputBlocked, MessageSubmitted, RequestAdmitted, RequestRefused
from topics import Role, Topics
from topics.catalogue import ADMISSION, ADMITTED, DEADLETTER, REQUESTS, TOKENS

log = logging.getLogger(__name__)
ROLE = Role(ADMISSION, reads=(REQUESTS,), writes=(ADMITTED, TOKENS, DEADLETTER))
# Refusals by reason (quota, too_long, invalid, ...) against admissions: the refusal part of the fallback rate.
DECISIONS = Counter("parley_admission_decisions", "admission's answer per request: admitted or the refusal reason",
                    ["plan", "outcome"])


@dataclass(frozen=True)
class AdmissionRules:
    pools: tuple[str, ...] = ("large", "small")  # the configured pools (infra/config/pools.toml)
    default_pool: str = "large"
    small_pool: str = "small"
    route_small_max_chars: int | None = None  # None: the classifier is off
    max_message_chars: int = 32_000
    min_visible_chars: int = 1
    chars_per_token: float = 3.0  # a cheap over-estimate for English; prompt build trues it up
    history_allowance: int = 1_000  # tokens for earlier turns; the prompt budget caps the real number

    @classmethod
    def from_settings(cls, settings: Settings, pools: Iterable[str]) -> AdmissionRules:
        return cls(pools=tuple(pools), default_pool=settings.default_pool,
                   max_message_chars=settings.max_message_chars,
                   route_small_max_chars=settings.route_small_max_chars,
                   min_visible_chars=settings.min_visible_chars, history_allowance=settings.history_allowance)


def visible_chars(text: str) -> int:
    """Characters a person can see: not whitespace, not control/format/unassigned code points."""
    return sum(1 for ch in text if not ch.isspace() and unicodedata.category(ch)[0] != "C")


def precheck(event: MessageSubmitted, rules: AdmissionRules) -> RequestRefused | None:
    """The input safety check: refuse what no model should see, before any budget is touched."""
    if len(event.content) > rules.max_message_chars:
        return _refused(event, "too_long", 413, f"Your message is {len(event.content):,} characters; the limit "
                                                f"is {rules.max_message_chars:,}. Shorten it and send again.")
    if visible_chars(event.content) < rules.min_visible_chars:
        return _refused(event, "invalid", 422, "Your message has no visible text — type something and send again.")
    if event.pool is not None and event.pool not in rules.pools:
        return _refused(event, "invalid", 422, f"Unknown model pool {event.pool!r}; choose one of "
                                               f"{', '.join(rules.pools)}.")
    return None


def estimate_prompt(event: MessageSubmitted, rules: AdmissionRules) -> int:
    """The message, the client's system turns (its instructions and any tool definitions: the prompt always
    keeps them whole) and an allowance for earlier turns."""
    system = sum(len(t.content) for t in event.history if t.role == "system") \
        if isinstance(event.history, list) else 0
    return int((len(event.content) + system) / rules.chars_per_token) + 1 + rules.history_allowance


def route(event: MessageSubmitted, rules: AdmissionRules) -> tuple[str, str]:
    """(pool, route_reason). The classifier is deliberately cheap: short and without code."""
    if event.pool is not None:
        return event.pool, "requested"
    limit = rules.route_small_max_chars
    if limit is not None and len(event.content.strip()) <= limit and "```" not in event.content:
        return rules.small_pool, "classifier"
    return rules.default_pool, "default"


def reply_cap(event: MessageSubmitted, plan: Plan) -> int:
    return plan.reply_cap if event.max_tokens is None else max(1, min(event.max_tokens, plan.reply_cap))


def decide(event: MessageSubmitted, outcome: Reservation | Refusal, rules: AdmissionRules,
           topics: Topics) -> list[Out]:
    """What admission emits for a request, given what the quota answered."""
    if isinstance(outcome, Refusal):
        refused = _refused(event, outcome.reason, outcome.status, outcome.message, outcome.retry_after_s)
        return [Out(topics.tokens, refused, event.generation_id)]
    if outcome.state == "settled":
        return []
    pool, reason = route(event, rules)
    admitted = RequestAdmitted(
        generation_id=event.generation_id, conversation_id=event.conversation_id, user_id=event.user_id,
        plan=event.plan, message_id=event.message_id, client_message_id=event.client_message_id,
        content=event.content, pool=pool, parent_id=event.parent_id, regenerate=event.regenerate,
        edit_of=event.edit_of, reply_cap=outcome.reply_cap, reserved_tokens=outcome.amount, route_reason=reason,
        temperature=event.temperature, history=event.history, sampling=event.sampling, deadline=event.deadline,
        fresh_conversation=event.fresh_conversation, made_listed=event.made_listed,
        made_unlisted=event.made_unlisted, instructions=event.instructions)
    return [Out(topics.admitted, admitted, event.conversation_id)]


def blocked(event: MessageSubmitted, verdict: Verdict, notice: str, topics: Topics) -> list[Out]:
    """A flagged message: the gateway's refusal (400, a notice that names no rule) and the record to save."""
    return [Out(topics.tokens, _refused(event, "blocked", 400, notice), event.generation_id),
            Out(topics.admitted, InputBlocked(
                generation_id=event.generation_id, conversation_id=event.conversation_id, user_id=event.user_id,
                plan=event.plan, message_id=event.message_id, client_message_id=event.client_message_id,
                regenerate=event.regenerate, block=verdict.block("input"), notice=notice), event.conversation_id)]


def _refused(event: MessageSubmitted, reason: Any, status: int, message: str,
             retry_after_s: float | None = None) -> RequestRefused:
    return RequestRefused(generation_id=event.generation_id, conversation_id=event.conversation_id,
                          user_id=event.user_id, reason=reason, message=message, status=status,
                          retry_after_s=retry_after_s)


class Admission:
    def __init__(self, quota: Quota, plans: Mapping[str, Plan], rules: AdmissionRules, topics: Topics,
                 classifier: Classifier | None = None, metrics: SafetyMetrics | None = None) -> None:
        self.quota, self.plans, self.rules, self.topics = quota, plans, rules, topics
        self.classifier, self.metrics = classifier, metrics or SafetyMetrics.of()

    async def handle(self, event: MessageSubmitted) -> list[Out]:
        if past_deadline(event.deadline):
            log.info("generation %s dropped: past its deadline by %.1f s (its client was answered 503); "
                     "nothing reserved, nothing charged", event.generation_id, time.time() - event.deadline)
            return []
        refused = precheck(event, self.rules)
        if refused is not None:
            log.info("generation %s refused: %s (%d)", event.generation_id, refused.reason, refused.status,
                     extra={"generation_id": event.generation_id, "plan": event.plan})
            DECISIONS.labels(plan=event.plan, outcome=refused.reason).inc()
            return [Out(self.topics.tokens, refused, event.generation_id)]
        flagged = await self._input_check(event)
        if flagged:
            DECISIONS.labels(plan=event.plan, outcome="input_blocked").inc()
            return flagged
        plan = self.plans[event.plan]
        estimate = estimate_prompt(event, self.rules)
        outcome = await self.quota.reserve(event.user_id, event.plan, event.generation_id, estimate,
                                           reply_cap=reply_cap(event, plan), conversation_id=event.conversation_id)
        outs = decide(event, outcome, self.rules, self.topics)
        ids = {"generation_id": event.generation_id, "user_id": event.user_id, "plan": event.plan}
        if isinstance(outcome, Refusal):
            DECISIONS.labels(plan=event.plan, outcome=str(outcome.reason)).inc()
            log.info("generation %s user %s refused: %s, retry after %.0f s", event.generation_id,
                     event.user_id, outcome.reason, outcome.retry_after_s, extra=ids)
        elif not outs:
            log.info("generation %s already settled; redelivered request skipped", event.generation_id, extra=ids)
        else:
            DECISIONS.labels(plan=event.plan, outcome="admitted").inc()
            admitted = outs[0].event
            log.info("generation %s user %s admitted: %d tokens reserved (%s), pool %s", event.generation_id,
                     event.user_id, outcome.amount, outcome.state,
                     admitted.pool if isinstance(admitted, RequestAdmitted) else None,
                     extra={**ids, "reserved_tokens": outcome.amount})
        return outs

    async def _input_check(self, event: MessageSubmitted) -> list[Out]:
        """The safety classifier on the message; [] when it passes (or the plan's policy skips it)."""
        if self.classifier is None:
            return []
        rules = self.classifier.rules.current()
        if not rules.policy(event.plan).input_check:
            return []
        verdict = await self.classifier.score(event.content, "input")
        self.metrics.observe("input", event.plan, verdict)
        if not verdict.flagged:
            return []
        log.info("generation %s user %s blocked by the input check: %s score %.3f, rules %s, %.1f ms",
                 event.generation_id, event.user_id, verdict.category, verdict.score, verdict.rules_version,
                 verdict.seconds * 1000)
        return blocked(event, verdict, rules.notice("input"), self.topics)


def build_stage(settings: Settings, quota: Quota, plans: Mapping[str, Plan], pools: Iterable[str], *,
                rules: AdmissionRules | None = None, classifier: Classifier | None = None,
                sealer: Sealer | None = None) -> Stage:
    """The admission consumer group, ready for ``run_stages``; ``classifier`` runs the input check."""
    admission = Admission(quota, plans, rules or AdmissionRules.from_settings(settings, pools),
                          Topics(settings.topic_prefix), classifier)
    # Keyed by user: one user's requests stay in order (their reservations), other users' go concurrently.
    return Stage(ROLE, settings, (MessageSubmitted,), admission.handle, per_key=True, sealer=sealer)
