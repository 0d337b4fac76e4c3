"""The watch list through a real Prometheus: the service's processes scraped on their metrics ports, traffic
sent over HTTP, every item read back with PromQL, and a report drawn from the same query API."""
from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import time
from collections.abc import Iterator

import httpx
import pytest

from infra.local import prometheus
from infra.local.report import render
from tests.e2e.client import collect
from tests.e2e.conftest import ARTIFACTS, Caller
from tests.e2e.service import Service, free_port
from tests.tools import missing

REPORT = ARTIFACTS / "metrics-report.png"
NOTES = "Travel notes: " + " ".join(f"day {i}: we walked through the old town, ate bread and saw a museum."
                                    for i in range(1, 21))


@pytest.fixture(scope="module")
def prom(service: Service, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A private Prometheus on a free port scraping this service's gateways, stages and workers."""
    binary = prometheus.find_binary()
    if binary is None:
        missing("Debian's prometheus", "apt-get install --no-install-recommends prometheus")
    home = tmp_path_factory.mktemp("prometheus")
    port = free_port()
    settings = service.settings.with_(state_dir=home, ports=service.settings.ports.__class__(
        **{**service.settings.ports.__dict__, "prometheus": port}))
    jobs = {"gateway": [f"127.0.0.1:{service.metrics_ports[g]}" for g in ("gateway-a", "gateway-b")],
            "stages": [f"127.0.0.1:{service.metrics_ports['stages']}"],
            "workers": [f"127.0.0.1:{p}" for n, p in service.metrics_ports.items() if n.startswith("worker-")]}
    config = prometheus.write_config(settings, {})  # the generated file and rules, then this service's targets
    data = json.loads(config.read_text())
    data["scrape_configs"] = [{"job_name": j, "scrape_interval": "2s", "static_configs": [{"targets": t}]}
                              for j, t in jobs.items()]
    data["global"]["evaluation_interval"] = "2s"
    config.write_text(json.dumps(data))
    log = (home / "prometheus.log").open("wb")
    proc = subprocess.Popen(list(prometheus.command(binary, settings, config)),
                            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 60
        while time.time() < deadline:
            try:
                if httpx.get(f"{base}/-/ready", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert proc.poll() is None, (home / "prometheus.log").read_text()[-2000:]
            time.sleep(0.5)
        yield base
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        shutil.rmtree(home, ignore_errors=True)


async def _value(base: str, expr: str) -> float | None:
    async with httpx.AsyncClient(timeout=10) as c:
        body = (await c.get(f"{base}/api/v1/query", params={"query": expr})).json()
    assert body["status"] == "success", body
    result = body["data"]["result"]
    return float(result[0]["value"][1]) if result else None


async def _count(base: str, expr: str) -> float:
    """A counter's sum now: 0 while no process has counted one yet."""
    value = await _value(base, f"({expr}) or vector(0)")
    assert value is not None
    return value


async def _until(base: str, expr: str, ok, timeout: float = 60) -> float:  # type: ignore[no-untyped-def]
    deadline = time.time() + timeout
    value = None
    while time.time() < deadline:
        value = await _value(base, expr)
        if value is not None and ok(value):
            return value
        await asyncio.sleep(1)
    raise AssertionError(f"{expr} = {value} after {timeout:.0f} s")


async def _chat(http: httpx.AsyncClient, caller: Caller, conversation: str, text: str) -> list:  # type: ignore[type-arg]
    async with http.stream("POST", f"/v1/conversations/{conversation}/messages", headers=caller.headers,
                           json={"content": text, "model": "large"}) as r:
        assert r.status_code == 200, await r.aread()
        return await collect(r)


async def test_watch_list_reads_back_through_promql(service: Service, prom: str, http: httpx.AsyncClient,
                                                    alice: Caller, bob: Caller) -> None:
    # The service is shared with the other e2e tests (some of which are flagged on purpose): every counter is
    # read once every target has been scraped, and what this test's traffic did is the difference from there.
    targets = 3 + sum(1 for n in service.metrics_ports if n.startswith("worker-"))
    await _until(prom, "count(up == 1)", lambda v: v >= targets)
    counters = {
        "ttft_paid": 'sum(parley_gateway_ttft_seconds_count{plan="paid"})',
        "tokens_free": 'sum(parley_gateway_completion_tokens_total{plan="free"})',
        "queued": "sum(parley_worker_queue_seconds_count)",
        "cached_large": 'sum(parley_worker_cached_prompt_tokens_total{pool="large"})',
        "decisions": "sum(parley_scheduler_decisions_total)",
        "not_routed": 'sum(parley_scheduler_decisions_total{outcome!="routed"})',
        "cost": "sum(parley_worker_cost_usd_total)",
        "worker_replies": "sum(parley_worker_replies_total)",
        "reconnects_free": 'sum(parley_gateway_stream_reconnects_total{plan="free"})',
        "input_checks": 'sum(parley_safety_checks_total{check="input"})',
        "blocks": "sum(parley_safety_blocks_total)",
        **{stage: f'sum(parley_stage_records_total{{stage="{stage}"}})'
           for stage in ("admission", "prompt", "scheduler", "persistence", "settlement")},
    }
    before = {name: await _count(prom, expr) for name, expr in counters.items()}

    async def grew(name: str, by: float) -> float:
        """Wait for a counter to rise ``by`` (or more) above where it stood; how much it rose."""
        expr = f"({counters[name]}) or vector(0)"
        return await _until(prom, expr, lambda v: v - before[name] >= by) - before[name]

    replies = 0
    for caller in (alice, bob):
        conv = (await http.post("/v1/conversations", headers=caller.headers)).json()["conversation_id"]
        # The second turn repeats the first as its prefix: long enough (~300 tokens) to fill whole KV blocks,
        # which is what vLLM's prefix cache shares.
        for question in (NOTES + " What is the capital of France? Answer in one word.", "And of Italy?"):
            frames = await _chat(http, caller, conv, question)
            assert frames[-1].event == "message_end", frames[-1]
            replies += 1
    # A reconnect: resume the last reply's stream from its first event.
    gid = frames[0].data["generation_id"]
    async with http.stream("GET", f"/v1/generations/{gid}/stream", headers=bob.headers,
                           params={"after": str(frames[0].id)}) as r:
        assert (await collect(r))[-1].event == "message_end"

    # TTFT end to end, by plan: alice's (paid) two replies counted, and a p95 that is a real duration.
    assert await grew("ttft_paid", 2) >= 2
    p95 = await _until(prom, 'max(histogram_quantile(0.95, sum by (le, plan) '
                             '(rate(parley_gateway_ttft_seconds_bucket[10m]))))', lambda v: v > 0)
    assert 0 < p95 < 120
    # Tokens by plan (bob is free), queue time, KV-cache use, prefix-cache hits (alice's second turn, large).
    assert await grew("tokens_free", 1) >= 1
    assert await grew("queued", replies) >= replies
    assert await _until(prom, "max(max_over_time(parley_worker_kv_cache_usage_ratio[1m]))", lambda v: v >= 0) <= 1
    assert await grew("cached_large", 1) > 0
    # Fallback rate (nothing overflowed here: 0 of this test's decisions), cost per 1,000 replies, lag,
    # reservations.
    assert await grew("decisions", replies) >= replies
    assert await _count(prom, counters["not_routed"]) == before["not_routed"]
    finished = await grew("worker_replies", replies)
    cost = 1000 * await grew("cost", 1e-9) / finished
    assert 0 < cost < 1000  # a few seconds of busy time at $2.50/hour, per reply
    prefix = service.settings.topic_prefix
    assert await _until(prom, f'sum(parley_kafka_consumer_lag_records{{group="{prefix}admission"}})',
                        lambda v: v == 0) == 0
    assert await _until(prom, "parley_reservations_outstanding", lambda v: v >= 0) >= 0
    assert await grew("reconnects_free", 1) >= 1
    # Safety: every message went through the input check, and none of this test's was flagged.
    assert await grew("input_checks", replies) >= replies
    assert await _count(prom, counters["blocks"]) == before["blocks"]
    # Every stage of the stages process is labelled and counted.
    for stage in ("admission", "prompt", "scheduler", "persistence", "settlement"):
        assert await grew(stage, 1) >= 1

    counts = render(prom, REPORT, minutes=5)
    assert REPORT.stat().st_size > 10_000
    queue = await _value(prom, "count(parley_worker_queue_seconds_bucket)")
    rate = await _value(prom, "sum(rate(parley_worker_queue_seconds_count[5m]))")
    assert all(n > 0 for n in counts.values()), (counts, queue, rate)

