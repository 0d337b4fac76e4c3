"""Admission decisions per second through the reserve script, against Redis's floor (``EVAL "return 1" 0``).

Two pairs, same op count and concurrency, on the running local Redis:
- ``redis-benchmark`` (C client, Debian's redis-tools): EVALSHA of ``quota_reserve.lua`` vs ``EVAL "return 1" 0``,
  so the ratio is the script's own cost;
- redis-py asyncio (what admission really uses): ``Quota.reserve`` vs ``EVAL "return 1" 0``.

Every decision admits a fresh user (the slowest path: all checks, then all writes). Keys live under bench
users and a bench expiry set, expire in a minute, and are deleted at the end.

    python -m tests.benchmarks.bench_admission [--ops 20000] [--clients 2]
"""
from __future__ import annotations

import argparse
import asyncio
import csv
import io
import shutil
import subprocess
import time
from typing import Any

import redis.asyncio as aioredis

from infra.config.plans import Plan
from infra.config.settings import Settings
from infra.stores import keys
from infra.stores.quota import Quota, _script
from infra.stores.quota_outcomes import Reservation, utc_day

SCOPE, TTL = "bench.", 60
PLAN = Plan("free", daily_tokens=30_000, bucket_tokens_per_minute=6_000, bucket_burst=12_000, max_running=2,
            reply_cap=512, queue_wait_limit_s=10, lane="free")


def redis_benchmark(settings: Settings, ops: int, clients: int, *command: str) -> float:
    exe = shutil.which("redis-benchmark")
    if exe is None:
        raise SystemExit("redis-benchmark not found: apt-get install redis-tools")
    out = subprocess.run([exe, "-h", settings.host, "-p", str(settings.ports.redis), "-n", str(ops), "-c",
                          str(clients), "-r", "100000000", "--csv", *command],
                         check=True, capture_output=True, text=True).stdout
    rows = list(csv.DictReader(io.StringIO(out)))
    return float(rows[-1]["rps"])


def reserve_command(sha: str, now: float) -> list[str]:
    """One reserve, as admission sends it, for a random bench user and generation."""
    user, gen = "bench-__rand_int__", "bench-__rand_int__"
    script_keys = [keys.quota_day(user, utc_day(now)), keys.quota_bucket(user), keys.quota_running(user),
                   keys.reservation(gen), keys.reservations_by_expiry(SCOPE), keys.settled(gen)]
    args = [gen, "1512", repr(now), str(PLAN.daily_tokens), str(PLAN.bucket_tokens_per_minute / 60),
            str(PLAN.bucket_burst), str(PLAN.max_running), str(TTL), str(TTL), user, "free", utc_day(now), "1000",
            "512", "c", str(TTL)]
    return ["EVALSHA", sha, str(len(script_keys)), *script_keys, *args]


async def python_rate(ops: int, clients: int, call: Any) -> float:
    counter = iter(range(ops))

    async def worker() -> None:
        for i in counter:
            await call(i)

    start = time.perf_counter()
    await asyncio.gather(*[worker() for _ in range(clients)])
    return ops / (time.perf_counter() - start)


async def cleanup(client: Any) -> int:
    removed = 0
    for pattern in (f"{keys.quota('bench-')}*", f"{keys.reservation('bench-')}*", f"{keys.settled('bench-')}*"):
        batch = [k async for k in client.scan_iter(match=pattern, count=1000)]
        for i in range(0, len(batch), 500):
            removed += await client.delete(*batch[i:i + 500])
    return removed + await client.delete(keys.reservations_by_expiry(SCOPE))


async def main(ops: int, clients: int) -> dict[str, float]:
    settings = Settings.from_env()
    client = aioredis.Redis.from_url(settings.redis_url)
    try:
        sha = await client.script_load(_script("reserve"))
        rates = {"benchmark_eval": redis_benchmark(settings, ops, clients, "EVAL", "return 1", "0"),
                 "benchmark_reserve": redis_benchmark(settings, ops, clients, *reserve_command(sha, time.time()))}
        # Random ids may collide (a repeat returns the existing reservation); refusals would leave no entry.
        recorded = await client.zcard(keys.reservations_by_expiry(SCOPE))
        assert recorded >= 0.99 * ops, f"only {recorded} of {ops} redis-benchmark reserves admitted"
        quota = Quota(client, {"free": PLAN}, scope=SCOPE, reservation_ttl_s=TTL, settled_ttl_s=TTL, day_ttl_s=TTL)
        admitted = 0

        async def reserve(i: int) -> None:
            nonlocal admitted
            outcome = await quota.reserve(f"bench-py{i}", "free", f"bench-py{i}", 1_000)
            admitted += isinstance(outcome, Reservation)  # after the await: no lost update between clients

        rates["python_eval"] = await python_rate(ops, clients, lambda i: client.eval("return 1", 0))
        rates["python_reserve"] = await python_rate(ops, clients, reserve)
        assert admitted == ops, f"only {admitted} of {ops} bench decisions admitted: the bench measured refusals"
    finally:
        await cleanup(client)
        await client.aclose()
    return rates


def report(rates: dict[str, float], ops: int, clients: int) -> None:
    print(f"admission decisions, {ops:,} ops, {clients} concurrent clients, every decision an admit")
    for client, label in (("benchmark", "redis-benchmark (C)"), ("python", "redis-py asyncio")):
        eval_rate, reserve_rate = rates[f"{client}_eval"], rates[f"{client}_reserve"]
        print(f"  {label:20s} EVAL 'return 1': {eval_rate:10,.0f}/s   reserve.lua: {reserve_rate:10,.0f}/s   "
              f"ratio reserve/raw: {reserve_rate / eval_rate:.2f}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ops", type=int, default=20_000)
    parser.add_argument("--clients", type=int, default=2)
    ns = parser.parse_args()
    report(asyncio.run(main(ns.ops, ns.clients)), ns.ops, ns.clients)
