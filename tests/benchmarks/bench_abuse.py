"""One user's abuse against another's first token: each hostile input of the abuse suite played in a loop by
one user while another keeps chatting, the victim's TTFT beside its baseline from the same run, as a ratio.

    python -m tests.benchmarks.bench_abuse [--seconds 10] [--victim-requests 24]

A private service on sim engines (``parley loadtest``'s, on the shared backbone) so the victim's first token
is the pipeline's and the simulated engine's, not a CPU model's. Each abuse prints what the attacker was
answered (every status it got, with counts: a 4xx that names the input, never a 5xx) and the victim's TTFT
p50 / max against the baseline taken just before it. Nothing is asserted on time: the ratios are the figures.
The attacker is a process of its own at the lowest CPU priority (its client would run on another machine); the
service's own work on every hostile request runs at its normal priority and counts in full.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx

from infra.local.loadtest_service import PrivateService, ServiceSpec, SimPool, launch
from tests.benchmarks.common import RESULTS, pct

USER = [{"role": "user", "content": "Say hello to the sea."}]
Attack = Callable[[httpx.AsyncClient], Awaitable[int]]


def _nested(levels: int) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "string"}
    for _ in range(levels):
        schema = {"type": "object", "properties": {"a": schema}, "required": ["a"]}
    return schema


async def _post(http: httpx.AsyncClient, path: str, body: dict[str, Any]) -> int:
    return (await http.post(path, json=body)).status_code


async def regex_schema(http: httpx.AsyncClient) -> int:
    return await _post(http, "/v1/chat/completions", {"model": "large", "messages": USER, "response_format": {
        "type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "string",
                                                                       "pattern": "^(a|aa){1,5000}b$"}}}})


async def deep_schema(http: httpx.AsyncClient) -> int:
    return await _post(http, "/v1/responses", {"model": "large", "input": "hi", "text": {"format": {
        "type": "json_schema", "name": "x", "schema": _nested(150)}}})


async def huge_numbers(http: httpx.AsyncClient) -> int:
    return await _post(http, "/v1/responses", {"model": "large", "input": "hi", "max_output_tokens": 1 << 64})


HISTORY = [{"role": "user" if i % 2 == 0 else "assistant", "content": "abcd"} for i in range(30_001)]


async def huge_history(http: httpx.AsyncClient) -> int:
    return await _post(http, "/v1/chat/completions", {"model": "large", "messages": HISTORY})


async def stream_flood(http: httpx.AsyncClient) -> int:
    """One stream held open to its end; played by more connections than the caps allow (8 open streams per user
    on a gateway, 2 replies running per user), the ones past them are refused."""
    async with http.stream("POST", "/v1/chat/completions", json={
            "model": "large", "messages": USER, "stream": True, "max_tokens": 400}) as r:
        if r.status_code == 200:
            async for _ in r.aiter_lines():
                pass
        return r.status_code


ATTACKS: dict[str, tuple[Attack, int]] = {  # name -> (one attempt, how many at once)
    "regex schema ^(a|aa){1,5000}b$": (regex_schema, 4),
    "schema nested 150 levels": (deep_schema, 4),
    "max_output_tokens 2^64": (huge_numbers, 4),
    "1 MB history (30,001 messages)": (huge_history, 2),
    "streams past the per-user cap (24 open)": (stream_flood, 24),
    # Not an abuse: the plan's 2 replies at once, back to back. What another user's allowed use costs the
    # victim on this machine, beside which the row above shows what the 22 refused streams add.
    "2 streams, the plan's replies at once (allowed use)": (stream_flood, 2),
}


async def victim_ttft(http: httpx.AsyncClient, n: int) -> list[float]:
    """``n`` streamed chat completions one after another: seconds to the first content chunk of each."""
    out = []
    for _ in range(n):
        start = time.perf_counter()
        async with http.stream("POST", "/v1/chat/completions", json={
                "model": "large", "messages": USER, "stream": True, "max_tokens": 16}) as r:
            assert r.status_code == 200, await r.aread()
            first = None
            async for line in r.aiter_lines():
                if first is None and line.startswith("data: {") and '"content"' in line:
                    first = time.perf_counter() - start
            out.append(first if first is not None else float("nan"))
    return out


async def _attack(http: httpx.AsyncClient, attack: Attack, width: int, until: float) -> Counter[int]:
    statuses: Counter[int] = Counter()

    async def loop() -> None:
        while time.monotonic() < until:
            try:
                statuses[await attack(http)] += 1
            except httpx.HTTPError as exc:
                statuses[-1] += 1  # a reset connection or a timeout: reported, never hidden
                print(f"  attacker: {type(exc).__name__}", file=sys.stderr)

    await asyncio.gather(*(loop() for _ in range(width)))
    return statuses


async def _attacker(url: str, token: str, name: str, seconds: float) -> None:
    """The attacker's own process (``--attack``): plays ``name`` for ``seconds``, prints its statuses as JSON."""
    attack, width = ATTACKS[name]
    async with httpx.AsyncClient(base_url=url, timeout=120, limits=httpx.Limits(max_connections=64),
                                 headers={"Authorization": f"Bearer {token}"}) as http:
        statuses = await _attack(http, attack, width, time.monotonic() + seconds)
    print(json.dumps(statuses))


async def _flood(svc: PrivateService, token: str, name: str, seconds: float) -> Counter[int]:
    """The abuse from a process of its own at the lowest CPU priority: a real attacker's client runs on its own
    machine, and in the victim's process its loop would delay the victim's own reads of its stream."""
    proc = await asyncio.create_subprocess_exec(
        "nice", "-n", "19", sys.executable, "-m", "tests.benchmarks.bench_abuse", "--attack", name,
        "--url", svc.url, "--token", token, "--seconds", str(seconds), stdout=asyncio.subprocess.PIPE)
    out, _ = await proc.communicate()
    assert proc.returncode == 0, f"attacker exited {proc.returncode}"
    return Counter({int(k): v for k, v in json.loads(out.decode().strip().splitlines()[-1]).items()})


async def run(svc: PrivateService, seconds: float, n: int) -> list[dict[str, Any]]:
    from infra.stores.accounts import Accounts
    from infra.stores.session import AsyncSession, connect

    cluster, session = connect(svc.settings)
    try:
        accounts = Accounts(AsyncSession(session))
        _, victim_token = await accounts.create_user("paid")
        _, attacker_token = await accounts.create_user("free")
    finally:
        cluster.shutdown()
    victim = httpx.AsyncClient(base_url=svc.url, timeout=120, headers={"Authorization": f"Bearer {victim_token}"})
    rows = []
    try:
        await victim_ttft(victim, 3)  # warm: the first requests load tokenizers and open connections
        for name in ATTACKS:
            base = await victim_ttft(victim, n)
            flood = asyncio.create_task(_flood(svc, attacker_token, name, seconds))
            await asyncio.sleep(min(2.0, seconds / 4))  # the abuse under way first (its process started)
            during = await victim_ttft(victim, n)
            statuses = await flood
            row: dict[str, Any] = {"abuse": name, "attacker statuses": dict(sorted(statuses.items())),
                                   "baseline p50 ms": round(pct(base, 50) * 1000, 1),
                                   "during p50 ms": round(pct(during, 50) * 1000, 1),
                                   "baseline max ms": round(max(base) * 1000, 1),
                                   "during max ms": round(max(during) * 1000, 1)}
            row["p50 ratio"] = round(row["during p50 ms"] / row["baseline p50 ms"], 2)
            rows.append(row)
            print(json.dumps(row))
    finally:
        await victim.aclose()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=10.0, help="each abuse runs this long")
    parser.add_argument("--victim-requests", type=int, default=24, help="victim requests before and during each")
    parser.add_argument("--attack", choices=ATTACKS, help=argparse.SUPPRESS)  # the attacker's own process
    parser.add_argument("--url", help=argparse.SUPPRESS)
    parser.add_argument("--token", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.attack:
        asyncio.run(_attacker(args.url, args.token, args.attack, args.seconds))
        return
    spec = ServiceSpec({"large": SimPool(workers=1, max_num_seqs=64, sim={"reply_tokens": 64}),
                        "small": SimPool(workers=1, max_num_seqs=32, sim={"reply_tokens": 16})})
    svc = launch(spec, Path(tempfile.mkdtemp(prefix="bench-abuse-")))
    try:
        rows = asyncio.run(run(svc, args.seconds, args.victim_requests))
    finally:
        svc.stop()
    print(f"\n{'abuse':42} {'attacker got':28} {'victim TTFT p50 ms, before -> during':38} ratio")
    for r in rows:
        got = ", ".join(f"{k}x{v}" for k, v in r["attacker statuses"].items())
        print(f"{r['abuse']:42} {got:28} {r['baseline p50 ms']:>8} -> {r['during p50 ms']:<27} {r['p50 ratio']}")
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / f"abuse-{time.strftime('%Y%m%d-%H%M%S')}.json"
    path.write_text(json.dumps(rows, indent=2))
    print(f"results: {path}")


if __name__ == "__main__":
    main()
