"""OpenAI's x-ratelimit-* headers from a quota snapshot."""
from __future__ import annotations

from producers.gateway.ratelimit import duration, from_snapshot


def test_headers_come_from_the_plan_and_where_the_user_stands() -> None:
    snapshot = {"remaining": 5000, "running": 1, "max_running": 2,
                "bucket": {"level": 7000.4, "burst": 12000, "tokens_per_minute": 6000, "full_in_s": 50.0}}
    assert from_snapshot(snapshot) == {
        "x-ratelimit-limit-requests": "2", "x-ratelimit-remaining-requests": "1",
        "x-ratelimit-reset-requests": "0s", "x-ratelimit-limit-tokens": "12000",
        "x-ratelimit-remaining-tokens": "5000",  # today's remainder caps the bucket
        "x-ratelimit-reset-tokens": "50s"}


def test_durations_read_like_openais() -> None:
    assert (duration(0), duration(1.5), duration(360), duration(75.2)) == ("0s", "1.5s", "6m0s", "1m15s")
