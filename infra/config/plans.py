"""Plans (free, paid, private): budgets, bucket, running-reply cap, reply cap, queue wait limit, and
what is kept: ``retention_days`` (0: until deleted) and ``no_retention`` (no text stored at all).

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
    retention_days: float = 0.0  # conversations idle longer than this are deleted; 0: kept until deleted
    no_retention: bool = False  # stream only: no text in Cassandra, not listed, no title, key gone at the end


def load_plans(environ: Mapping[str, str] | None = None) -> dict[str, Plan]:
    environ = os.environ if environ is None else environ
    path = Path(environ.get("PARLEY_PLANS_FILE") or DEFAULT_FILE)
    with path.open("rb") as fh:
        tables = tomllib.load(fh).get("plans", {})
    plans = {name: Plan(name=name, **values) for name, values in tables.items()}
    if not {"free", "paid"} <= set(plans):
        raise ValueError(f"{path} must define plans.free and plans.paid")
    return plans
