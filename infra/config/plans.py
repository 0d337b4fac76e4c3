"""Plans (free, paid): budgets, bucket, running-reply cap, reply cap and queue wait limit.

Read once per process from ``infra/config/plans.toml`` or ``PARLEY_PLANS_FILE``.
"""
from __future__ import annotations

import os
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

DEFAULT_FILE = Path(__file__).with_name("plans.toml")


@dataclass(frozen=True)
class Plan:
    name: str
    daily_tokens: int
    bucket_tokens_per_minute: int
    bucket_burst: int
    max_running: int
    reply_cap: int
    queue_wait_limit_s: float
    lane: str


def load_plans(environ: Mapping[str, str] | None = None) -> dict[str, Plan]:
    environ = os.environ if environ is None else environ
    path = Path(environ.get("PARLEY_PLANS_FILE") or DEFAULT_FILE)
    with path.open("rb") as fh:
        tables = tomllib.load(fh).get("plans", {})
    plans = {name: Plan(name=name, **values) for name, values in tables.items()}
    if not {"free", "paid"} <= set(plans):
        raise ValueError(f"{path} must define plans.free and plans.paid")
    return plans
