"""Plans (free, paid, private): budgets, bucket, running-reply cap, reply cap, queue wait limit, and
what is kept: ``retention_days`` (0: until deleted) and ``no_retention`` (no text stored at all).

Read once per process from the file ``Settings.plans_file`` names (``infra/config/plans.toml`` by default).
"""
from __future__ import annotations

import tomllib
from dataclasses import dataclass
from pathlib import Path

from schemas.scheduler import LANES, Lane

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
    lane: Lane
    retention_days: float = 0.0  # conversations idle longer than this are deleted; 0: kept until deleted
    no_retention: bool = False  # stream only: no text in Cassandra, not listed, no title, key gone at the end


def load_plans(path: Path = DEFAULT_FILE) -> dict[str, Plan]:
    with path.open("rb") as fh:
        tables = tomllib.load(fh).get("plans", {})
    plans = {name: Plan(name=name, **values) for name, values in tables.items()}
    if not {"free", "paid"} <= set(plans):
        raise ValueError(f"{path} must define plans.free and plans.paid")
    wrong = sorted(p.name for p in plans.values() if p.lane not in LANES)
    if wrong:
        raise ValueError(f"{path}: plans {', '.join(wrong)} name a lane that does not exist; lanes: {', '.join(LANES)}")
    return plans
