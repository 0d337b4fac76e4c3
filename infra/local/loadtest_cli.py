"""``parley loadtest``: play the seeds' traffic against Parley and measure it (``producers/loadgen``).

    parley loadtest --url http://127.0.0.1:8000 [--token T ...] --rate 1 --duration 30
        an existing service (the one `parley up` runs, by default); its processes are found from `up`'s pid files
    parley loadtest --scenario replica|stages|gateway|spike|prefill|tokens|routing|latency
                    [--duration S] [--rate-scale X]
        a private service on sim engines (own topic prefix and keyspace, the shared backbone), started, loaded
        and stopped; figures and PNGs under bench-results/loadtest/
"""
from __future__ import annotations

import argparse
import asyncio
import json
import time
from pathlib import Path
from typing import Any

from infra.config.pools import load_pools
from infra.config.settings import Settings
from infra.local import loadtest_routing
from infra.local import loadtest_scenarios as scenarios
from infra.local.loadtest_service import KEYSPACE, PrivateService, ServiceSpec, launch
from producers.loadgen import accounts, report, table
from producers.loadgen import run as loadrun
from producers.loadgen.arrivals import Phase

BACKBONE = ("kafka", "cassandra", "redis")


def add_arguments(parser: argparse.ArgumentParser, name: str) -> None:
    parser.add_argument("--scenario", choices=sorted(scenarios.SCENARIOS), help="start a private sim service")
    parser.add_argument("--url", default=None, help="an existing service (default: this machine's gateway)")
    parser.add_argument("--token", action="append", default=[], help="bearer token to send as (repeatable; "
                                                                          "default: new users in its keyspace)")
    parser.add_argument("--rate", type=float, default=1.0, help="--url: requests a second (Poisson)")
    parser.add_argument("--duration", type=float, default=None, help="seconds of arrivals (--url: default 30; "
                                                                        "--scenario: caps each phase)")
    parser.add_argument("--rate-scale", type=float, default=1.0, help="--scenario: multiply every rate")
    parser.add_argument("--max-tokens", type=int, default=2000, help="--url: reply cap asked per request")
    parser.add_argument("--users", type=int, default=None, help="users to create (default: enough for the load)")
    parser.add_argument("--paid-share", type=float, default=0.5, help="share of paid users")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--stream-interval", type=int, default=None,
                        help="--scenario: every pool's engine hands over a reply's tokens this often (default: "
                             "each scenario's own)")
    parser.add_argument("--flush-drain", choices=("on", "off"), default=None,
                        help="--scenario: every pool's reply loops take their outputs at their flush tick (on) or "
                             "at every engine output (off) (default: each scenario's own)")
    parser.add_argument("--flush-groups", type=int, default=None,
                        help="--scenario: every pool's flush clock ticks this many groups a window (default: "
                             "each scenario's own)")
    parser.add_argument("--repeat", type=int, default=1,
                        help="--scenario marginal: play its two steps this many times in turn (the split is the "
                             "mean of the pairs, with their range)")
    parser.add_argument("--keyspace", default=KEYSPACE, help="--scenario: the private service's keyspace")
    parser.add_argument("--summary", type=Path, default=None, help="--scenario: also write the summary here")


def run(args: argparse.Namespace) -> int:
    if args.scenario:
        return asyncio.run(_scenario(args))
    return asyncio.run(_existing(args))


# -- an existing service ------------------------------------------------------------------------------------
def _pid_files(settings: Settings) -> dict[str, int]:
    """The processes `parley up` recorded (supervisors: each counts with its child and the child's children)."""
    out = {}
    for path in sorted((settings.state_dir / "run").glob("*.pid")):
        try:
            out[path.stem] = int(path.read_text().split()[0])
        except (OSError, ValueError, IndexError):
            continue
    return {n: p for n, p in out.items() if Path(f"/proc/{p}").exists()}


async def _existing(args: argparse.Namespace) -> int:
    settings = Settings.from_env()
    url = args.url or f"http://127.0.0.1:{settings.ports.gateway}"
    pools = load_pools(settings)
    target = loadrun.Target(url, settings, tuple(pools), _pid_files(settings),
                        {p: f"http://127.0.0.1:{c.metrics_port}/metrics" for p, c in pools.items() if c.metrics_port},
                        f"http://127.0.0.1:{settings.ports.stages_metrics}/metrics")
    load = loadrun.Load((Phase(args.duration or 30.0, args.rate),), seed=args.seed, max_tokens=args.max_tokens)
    users = accounts.given(args.token) or await accounts.make_users(
        settings, *accounts.split(args.users or _users_for(load), args.paid_share))
    await loadrun.measure(target, load, users, "url")
    return 0


def _users_for(load: loadrun.Load) -> int:
    """Enough users that the per-user cap of 2 running replies is rarely what limits the load."""
    peak = max(p.rate for p in load.phases)
    return int(min(400, max(4, peak * 60 / 2)))


# -- a scenario on a private service ----------------------------------------------------------------------
def _target(svc: PrivateService, settings: Settings) -> loadrun.Target:
    pids = {name: p.pid for name, p in svc.procs.items()}
    pids.update({n: p for n, p in _pid_files(settings).items() if n.split("-")[0] in BACKBONE})
    return loadrun.Target(svc.url, svc.settings, tuple(svc.spec.pools), pids, svc.workers(),
                      f"http://127.0.0.1:{svc.metrics['stages']}/metrics")


async def _scenario(args: argparse.Namespace) -> int:
    knobs = scenarios.Knobs(args.duration, args.rate_scale, args.seed, args.repeat)
    steps = scenarios.SCENARIOS[args.scenario](knobs)
    if args.stream_interval is not None:
        steps = [scenarios.with_stream_interval(step, args.stream_interval) for step in steps]
    if args.flush_drain is not None:
        steps = [scenarios.with_flush_drain(step, args.flush_drain == "on") for step in steps]
    if args.flush_groups is not None:
        steps = [scenarios.with_flush_groups(step, args.flush_groups) for step in steps]
    settings, rows, svc, spec, previous = Settings.from_env(), [], None, None, None
    try:
        for step in steps:
            if step.service != spec or (previous is not None and previous.leave_after_s):
                svc = await _restart(svc, step.service, args.keyspace)
                spec = step.service
            assert svc is not None
            users = await accounts.make_users(svc.settings, *accounts.split(args.users or _users_for(step.load),
                                                                                args.paid_share))
            measuring = loadrun.measure(_target(svc, settings), step.load, users, f"{args.scenario}",
                                        {"step": step.label, "pools": _pools_json(step.service)})
            replicas: dict[str, Any] = {}
            if step.probe:
                result, replicas = await loadtest_routing.probe(svc, step.probe, measuring, step.leave_after_s)
            else:
                result = await measuring
            rows.append({"step": step.label, **report.headline(result), **replicas,
                         "sustained": scenarios.sustained(result), "busiest": scenarios.busiest(result),
                         "files": result.get("files", [])})
            previous = step
            if step.stepped and not rows[-1]["sustained"]:
                break
    finally:
        if svc is not None:
            await asyncio.to_thread(svc.stop)
    _conclude(args.scenario, rows, steps, args.summary)
    return 0


async def _restart(svc: PrivateService | None, spec: ServiceSpec, keyspace: str) -> PrivateService:
    if svc is not None:
        await asyncio.to_thread(svc.stop)
    began = time.monotonic()
    svc = await asyncio.to_thread(launch, spec, loadrun.RESULTS / "services", keyspace)
    print(f"private service {svc.settings.topic_prefix.rstrip('.')} ready in {time.monotonic() - began:.0f} s "
          f"({', '.join(svc.procs)}); logs in {svc.log_dir}")
    return svc


def _pools_json(spec: ServiceSpec) -> dict[str, Any]:
    return {n: {"workers": p.workers, "max_num_seqs": p.max_num_seqs, "sim": p.sim, "routing": p.routing,
                "stream_interval": p.stream_interval, "flush_drain": p.flush_drain,
                "flush_groups": p.flush_groups} for n, p in spec.pools.items()}


def _conclude(name: str, rows: list[dict[str, Any]], steps: list[scenarios.Step], also: Path | None) -> None:
    """The scenario's table; for a ramp, the highest sustained step and the busiest process of the first that
    was not; for the spike, the capacity model's longest wait beside the measured one."""
    table.console().print(table.scenario_table(name, rows))
    verdict: dict[str, Any] = {}
    if any(s.stepped for s in steps):
        ok = [r for r in rows if r["sustained"]]
        failed = next((r for r in rows if not r["sustained"]), None)
        verdict = {"highest_sustained": ok[-1]["step"] if ok else None,
                   "first_not_sustained": failed["step"] if failed else None,
                   "saturated_first": failed["busiest"] if failed else None}
    if name == "spike" and steps:
        peak = max(p.rate for p in steps[0].load.phases)
        seconds = max(p.seconds for p in steps[0].load.phases)
        verdict["model"] = scenarios.spike_prediction(peak, peak * 5 / 7, seconds)
    if name == "routing":
        verdict["policies"] = {r["step"]: {k: r.get(k) for k in ("prefix_hit_rate", "ttft_ms_p50", "ttft_ms_p99",
                                                                   "queue_max_over_mean", "completed", "sent")}
                               for r in rows}
    if name == "marginal" and len(rows) >= 2:
        verdict["split"] = scenarios.split_costs(rows)
        verdict["pairs"] = [scenarios.split_cost(a, b) for a, b in zip(rows[0::2], rows[1::2], strict=False)]
        for proc, cost in verdict["split"].items():
            if isinstance(cost, dict):
                print(f"  {proc:>19}: {cost['ms_per_token']:.4f} ms a token ({cost['min']:.4f} to {cost['max']:.4f}),"
                      f" {cost['ms_per_request']:.1f} ms a request")
    if verdict:
        print(json.dumps(verdict))
    loadrun.RESULTS.mkdir(parents=True, exist_ok=True)
    path = loadrun.RESULTS / f"{name}-summary-{time.strftime('%Y%m%d-%H%M%S')}.json"
    text = json.dumps({"scenario": name, "steps": rows, "verdict": verdict}, indent=1, default=str) + "\n"
    for out in (path, also) if also else (path,):
        out.write_text(text)
    print(f"summary: {path}")
