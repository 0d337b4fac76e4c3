"""Prometheus metrics of the safety checks: checks and blocks per check and plan (their ratio is the
block rate), and classifier latency per check. One set per registry (the worker has its own)."""
from __future__ import annotations

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Histogram

from consumers.safety.classifier import Verdict

_LAT = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1)
_BY_REGISTRY: dict[int, SafetyMetrics] = {}


class SafetyMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.checks = Counter("parley_safety_checks", "texts classified", ["check", "plan"], registry=registry)
        self.blocks = Counter("parley_safety_blocks", "texts blocked", ["check", "plan", "category"],
                              registry=registry)
        self.latency = Histogram("parley_safety_classifier_seconds", "classifier time per text (input: the "
                                 "message; output: one chunk)", ["check"], buckets=_LAT, registry=registry)

    @classmethod
    def of(cls, registry: CollectorRegistry = REGISTRY) -> SafetyMetrics:
        """One per registry: a process that builds two stages does not register the names twice."""
        if id(registry) not in _BY_REGISTRY:
            _BY_REGISTRY[id(registry)] = cls(registry)
        return _BY_REGISTRY[id(registry)]

    def observe(self, check: str, plan: str, verdict: Verdict) -> None:
        self.checks.labels(check, plan).inc()
        self.latency.labels(check).observe(verdict.seconds)
        if verdict.flagged:
            self.blocks.labels(check, plan, verdict.category).inc()
