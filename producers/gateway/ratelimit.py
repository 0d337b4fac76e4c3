"""OpenAI's ``x-ratelimit-*`` response headers, from the caller's plan and where they stand in it.

OpenAI counts requests per minute and tokens per minute. Parley limits replies running at once
(the ``-requests`` trio: the plan's ``max_running``, how many are free now, reset when one ends:
reported as 0s) and tokens with a per-minute bucket under a daily budget (the ``-tokens`` trio:
the bucket's size, what it holds capped by today's remainder, and the time until it is full).
"""
from __future__ import annotations

import logging
from typing import Any

from redis.exceptions import RedisError

log = logging.getLogger(__name__)


def duration(seconds: float) -> str:
    """OpenAI's format: ``6m0s``, ``1.5s``, ``0s``."""
    seconds = max(0.0, seconds)
    minutes, rest = divmod(seconds, 60)
    if minutes >= 1:
        return f"{int(minutes)}m{rest:.0f}s"
    return f"{rest:.3g}s" if rest else "0s"


def from_snapshot(s: dict[str, Any]) -> dict[str, str]:
    bucket = s["bucket"]
    tokens_left = max(0, min(int(bucket["level"]), int(s["remaining"])))
    return {
        "x-ratelimit-limit-requests": str(s["max_running"]),
        "x-ratelimit-remaining-requests": str(max(0, s["max_running"] - s["running"])),
        "x-ratelimit-reset-requests": "0s",
        "x-ratelimit-limit-tokens": str(bucket["burst"]),
        "x-ratelimit-remaining-tokens": str(tokens_left),
        "x-ratelimit-reset-tokens": duration(bucket["full_in_s"]),
    }


async def headers(quota: Any, user_id: str, plan: str) -> dict[str, str]:
    """The headers, or none when the quota store cannot say (a response is never refused for this)."""
    if quota is None:
        return {}
    try:
        return from_snapshot(await quota.snapshot(user_id, plan))
    except RedisError as exc:
        log.warning("rate-limit headers left out: %s", type(exc).__name__)
        return {}
