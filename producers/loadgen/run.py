"""One measured load against one service: a quiet window first (each process's idle CPU), the meters read
before, the load played with the hop tap and the sampler running, the meters read after; then the report,
printed and written (JSON and PNG) under ``bench-results/loadtest/``."""
from __future__ import annotations

import asyncio
import json
import os
import platform
import random
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx

from infra.config.settings import Settings
from producers.loadgen import arrivals, cpu, plot, report, scrape, table
from producers.loadgen.client import ChatClient
from producers.loadgen.drive import Progress, play
from producers.loadgen.hops import HopTap, record_gaps
from producers.loadgen.offsets import end_offsets
from producers.loadgen.sampler import Sampler
from producers.loadgen.statements import StatementCounter, difference
from producers.loadgen.workload import User, Workload
from topics import Topics

RESULTS = Path(__file__).resolve().parents[2] / "bench-results" / "loadtest"


@dataclass(frozen=True)
class Target:
    """A running Parley: where to send, what to meter."""

    url: str
    settings: Settings  # its Kafka, topic prefix, Cassandra keyspace
    pools: tuple[str, ...]
    pids: dict[str, int]  # process name -> pid (its tree is counted)
    worker_metrics: dict[str, str] = field(default_factory=dict)  # pool -> /metrics URL
    stages_metrics: str | None = None


# The stages publish consumer lag every 5 s (``infra.local.telemetry.POLL_S``) and commit offsets at most twice a
# second, so a sample taken while records still arrive counts the ones merely in flight. The last sample is taken
# this long after the last reply ended: what is left then is lag the stages did not catch up on.
LAG_SETTLE_S = 6.5


@dataclass(frozen=True)
class Load:
    """What to play: the arrival phases and the shape of each request."""

    phases: tuple[arrivals.Phase, ...]
    seed: int = 0
    limit: int = 2000  # arrivals at most
    max_in_flight: int = 600
    drain_s: float = 60.0  # after the last arrival, streams still open this long are cut
    max_tokens: int | None = 2000  # the seeds' reply cap; replies run ~640 tokens on the sim engine
    max_turns: int = 4
    message_tokens: int = 300
    follow_share: float = 0.6
    quiet_s: float = 5.0
    request_timeout_s: float = 120.0


async def engine_figures(http: httpx.AsyncClient, target: Target) -> dict[str, scrape.Samples]:
    return {pool: await scrape.fetch(http, url, scrape.ENGINE) for pool, url in target.worker_metrics.items()}


async def measure(target: Target, load: Load, users: list[User], scenario: str,
                  extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """Play ``load`` against ``target``; the report (also written and printed)."""
    pids = {**target.pids, report.CLIENT: os.getpid()}
    tokens_topic = Topics(target.settings.topic_prefix).tokens
    counter = StatementCounter(target.settings)
    idle = await cpu.measure(pids, load.quiet_s)
    async with httpx.AsyncClient() as http:
        engine_before, statements_before = await engine_figures(http, target), await counter.count()
        offsets_before = await end_offsets(target.settings.kafka_bootstrap, tokens_topic)
        tap = HopTap(target.settings.kafka_bootstrap, target.settings.topic_prefix, target.pools)
        await tap.start()
        progress, client = Progress(), ChatClient(target.url, load.request_timeout_s, load.max_tokens)
        sampler = Sampler(progress, target.worker_metrics, target.stages_metrics, target.settings.topic_prefix)
        cpu_before, began = cpu.snapshot(pids), time.monotonic()
        sampler.start()
        try:
            records = await play(arrivals.schedule(load.phases, load.seed, load.limit), _workload(load, users),
                                 client, load.drain_s, load.max_in_flight, progress)
            await asyncio.sleep(1.0)  # the last events reach the tap
            cpu_after, ended = cpu.snapshot(pids), time.monotonic()
            if target.stages_metrics:
                await asyncio.sleep(LAG_SETTLE_S)  # the lag left standing at the end, not the load's own
        finally:
            await sampler.stop()
            await client.close()
            await tap.stop()
        run_window = cpu.between(cpu_before, cpu_after, ended - began)
        measured = report.Measured(
            records, progress.started, idle, run_window,
            await end_offsets(target.settings.kafka_bootstrap, tokens_topic) - offsets_before,
            difference(statements_before, await counter.count()), engine_before, await engine_figures(http, target),
            tap.marks, sampler.rows, arrivals.duration(load.phases), record_gaps(tap.appended))
    meta = {"scenario": scenario, "url": target.url, "taken_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "host": platform.node(), "cpus": os.cpu_count(), "load_avg_1m": round(os.getloadavg()[0], 2),
            "load": _load_json(load), "users": len(users), **(extra or {})}
    result = report.build(measured, meta)
    write(result, measured, scenario)
    return result


def _workload(load: Load, users: list[User]) -> Workload:
    return Workload(users, random.Random(load.seed), max_turns=load.max_turns, follow_share=load.follow_share,
                    message_tokens=load.message_tokens)


def _load_json(load: Load) -> dict[str, Any]:
    return {**asdict(load), "phases": [asdict(p) for p in load.phases]}


def write(result: dict[str, Any], measured: report.Measured, scenario: str) -> Path:
    """JSON (the report, the samples and every request) and PNG, named by scenario and time; prints the table."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    stem = RESULTS / f"{scenario}-{time.strftime('%Y%m%d-%H%M%S')}"
    body = {**result, "samples": measured.samples, "records": [r.to_json() for r in measured.records]}
    stem.with_suffix(".json").write_text(json.dumps(body, indent=1, default=str) + "\n")
    png = plot.draw(stem.with_suffix(".png"), measured.records, measured.started, measured.samples,
                    f"parley loadtest {scenario}")
    table.show(result)
    print(f"results: {stem.with_suffix('.json')}" + (f" and {png}" if png else ""))
    result["files"] = [str(stem.with_suffix(".json"))] + ([str(png)] if png else [])
    return stem
