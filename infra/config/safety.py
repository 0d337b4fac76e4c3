"""The content rules (``infra/config/safety.toml``, or the file Settings names): versioned, typed,
and re-read when the file changes, so new rules take effect without restarting a worker.

``SafetyRules`` is one parsed version of the file; ``RulesFile.current()`` returns the newest
good one (a file that fails to parse keeps the previous rules and says why in the log).
"""
from __future__ import annotations

import logging
import re
import time
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from schemas.errors import ParleyError

log = logging.getLogger(__name__)
DEFAULT_FILE = Path(__file__).with_name("safety.toml")
Check = Literal["input", "output"]
CHECKS: tuple[Check, ...] = ("input", "output")


class SafetyRulesError(ParleyError, ValueError):
    """The rules file is missing, not TOML, or has a field of the wrong shape."""


@dataclass(frozen=True)
class Rule:
    category: str
    pattern: re.Pattern[str]
    checks: frozenset[str]


@dataclass(frozen=True)
class PlanPolicy:
    input_check: bool = True
    output_check: bool = True
    hold_back_sentences: int = 0  # 0: show at once, check after; 1: hold each sentence until checked
    chunk_tokens: int = 24  # a chunk ends at a sentence end or after this many tokens


@dataclass(frozen=True)
class SafetyRules:
    version: str
    model_category: str = "profanity"
    thresholds: dict[str, float] = field(default_factory=lambda: {"input": 0.9, "output": 0.9})
    rules: tuple[Rule, ...] = ()
    plans: dict[str, PlanPolicy] = field(default_factory=dict)
    notices: dict[str, str] = field(default_factory=dict)

    def rules_for(self, check: Check) -> tuple[Rule, ...]:
        return tuple(r for r in self.rules if check in r.checks)

    def policy(self, plan: str) -> PlanPolicy:
        return self.plans.get(plan, PlanPolicy())

    def notice(self, check: Check) -> str:
        return self.notices.get(check, "This was removed because it goes against the content rules.")


def parse(data: dict[str, Any], source: str = "rules") -> SafetyRules:
    try:
        model = data.get("model", {})
        rules = tuple(_rule(r) for r in data.get("rules", []))
        plans = {name: PlanPolicy(**values) for name, values in data.get("plans", {}).items()}
        return SafetyRules(
            version=str(data["version"]), model_category=str(model.get("category", "profanity")),
            thresholds={c: float(model.get(f"{c}_threshold", 0.9)) for c in CHECKS}, rules=rules, plans=plans,
            notices={str(k): str(v) for k, v in data.get("notices", {}).items()})
    except (KeyError, TypeError, ValueError, re.error) as exc:
        raise SafetyRulesError(f"{source}: {type(exc).__name__}: {exc}") from exc


def _rule(raw: dict[str, Any]) -> Rule:
    checks = frozenset(raw.get("checks", CHECKS))
    if not checks <= set(CHECKS):
        raise ValueError(f"rule {raw.get('category')!r}: checks must be among {CHECKS}, got {sorted(checks)}")
    if "regex" in raw:
        pattern = re.compile(raw["regex"], re.IGNORECASE)
    else:
        pattern = re.compile(r"\b" + re.escape(str(raw["phrase"])) + r"\b", re.IGNORECASE)
    return Rule(str(raw["category"]), pattern, checks)


def load(path: Path) -> SafetyRules:
    try:
        with path.open("rb") as fh:
            return parse(tomllib.load(fh), str(path))
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise SafetyRulesError(f"{path}: {exc}") from exc


class RulesFile:
    """The rules as they are now: the file's mtime is looked at most every ``every_s`` seconds."""

    def __init__(self, path: Path, every_s: float = 1.0) -> None:
        self.path, self.every_s = path, every_s
        self._mtime = path.stat().st_mtime_ns
        self._rules = load(path)
        self._checked = time.monotonic()

    def current(self) -> SafetyRules:
        now = time.monotonic()
        if now - self._checked >= self.every_s:
            self._checked = now
            self._reload_if_changed()
        return self._rules

    def _reload_if_changed(self) -> None:
        try:
            mtime = self.path.stat().st_mtime_ns
            if mtime == self._mtime:
                return
            rules = load(self.path)
        except (OSError, SafetyRulesError) as exc:
            log.warning("safety rules not reloaded, keeping version %s: %s", self._rules.version, exc)
            return
        self._mtime = mtime
        if rules.version != self._rules.version:
            log.info("safety rules reloaded: version %s -> %s", self._rules.version, rules.version)
        self._rules = rules
