"""`parley lab`: run the three batching modes on one replica, then the fleet spike; print and plot.

PNGs go to --out (default bench-results/lab, which git ignores); --json prints the figures instead of
tables, and --no-plots skips matplotlib.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict
from pathlib import Path

from infra.planning.lab.fleet import FleetConfig, FleetRun, simulate_fleet
from infra.planning.lab.metrics import Summary, summarize
from infra.planning.lab.sim import LabConfig, Mode, Run, simulate


def add_arguments(parser: argparse.ArgumentParser, name: str = "lab") -> None:
    lab, fleet = LabConfig(), FleetConfig()
    parser.add_argument("--seed", type=int, default=lab.seed, help="random seed for both simulations")
    parser.add_argument("--rate", type=float, default=lab.arrival_rps, help="arrivals at the replica, req/s")
    parser.add_argument("--duration", type=float, default=lab.duration_s, help="replica window, s")
    parser.add_argument("--max-seqs", type=int, default=lab.max_seqs, help="batch cap, continuous modes")
    parser.add_argument("--static-max-seqs", type=int, default=lab.static_max_seqs, help="batch cap, static")
    parser.add_argument("--chunk-tokens", type=int, default=lab.chunk_tokens, help="prefill chunk, tokens")
    parser.add_argument("--replicas", type=int, default=fleet.replicas, help="fleet replicas")
    parser.add_argument("--capacity-rps", type=float, default=fleet.capacity_rps, help="fleet service rate")
    parser.add_argument(
        "--base-rps", type=float, default=fleet.base_rps, help="fleet arrivals outside the spike"
    )
    parser.add_argument(
        "--spike-rps", type=float, default=fleet.spike_rps, help="fleet arrivals in the spike"
    )
    parser.add_argument("--limit-s", type=float, default=fleet.wait_limit_s, help="free-plan wait limit, s")
    parser.add_argument("--out", type=Path, default=Path("bench-results/lab"), help="where the PNGs go")
    parser.add_argument("--no-plots", action="store_true", help="print figures only")
    parser.add_argument("--json", action="store_true", help="print figures as JSON")


def configs(args: argparse.Namespace) -> tuple[LabConfig, FleetConfig]:
    lab = LabConfig(
        seed=args.seed,
        arrival_rps=args.rate,
        duration_s=args.duration,
        max_seqs=args.max_seqs,
        static_max_seqs=args.static_max_seqs,
        chunk_tokens=args.chunk_tokens,
    )
    fleet = FleetConfig(
        seed=args.seed,
        replicas=args.replicas,
        capacity_rps=args.capacity_rps,
        base_rps=args.base_rps,
        spike_rps=args.spike_rps,
        wait_limit_s=args.limit_s,
    )
    return lab, fleet


def fleet_figures(limited: FleetRun, unlimited: FleetRun) -> dict[str, float]:
    from infra.planning.lab.fleet import queue_series

    return {
        "arrived": len(limited.requests),
        "served_large": limited.served,
        "overflowed_small": limited.overflowed,
        "max_wait_s": limited.max_wait_s,
        "max_queue": max(queue_series(limited)[1]),
        "no_limit_max_queue": max(queue_series(unlimited)[1]),
        "no_limit_max_wait_s": unlimited.max_wait_s,
    }


def _print_tables(summaries: list[Summary], fleet: dict[str, float], lab: LabConfig, fc: FleetConfig) -> None:
    from rich.console import Console
    from rich.table import Table

    t = Table(title=f"One replica, {lab.duration_s:g} s, {lab.arrival_rps:g} req/s, seed {lab.seed}")
    for col in ("mode", "done", "tok/s", "TTFT p50/p95 s", "queue p50/p95 s", "max step ms"):
        t.add_column(col, justify="left" if col == "mode" else "right")
    for s in summaries:
        t.add_row(
            s.mode, f"{s.completed}/{s.arrived}", f"{s.tokens_per_s:.0f}",
            f"{s.ttft_p50_s:.2f} / {s.ttft_p95_s:.2f}", f"{s.queue_p50_s:.2f} / {s.queue_p95_s:.2f}",
            f"{s.longest_step_ms:.0f}",
        )  # fmt: skip
    f = Table(title=f"Fleet spike, seed {fc.seed}")
    f.add_column("figure")
    f.add_column("value", justify="right")
    for k, v in fleet.items():
        f.add_row(k.replace("_", " "), f"{v:,.1f}" if isinstance(v, float) else f"{v:,}")
    console = Console()
    console.print(t)
    console.print("Waits still open at the end count as waited-so-far, so p95s are lower bounds.")
    console.print(f)
    console.print(
        f"{fc.replicas} replicas at {fc.capacity_rps:g} req/s; {fc.base_rps:g} req/s, then {fc.spike_rps:g} for "
        f"{fc.spike_s:g} s; past a {fc.wait_limit_s:g} s estimated wait a request goes to the small model."
    )


def run(args: argparse.Namespace) -> int:
    lab, fc = configs(args)
    runs: list[Run] = [simulate(lab, mode) for mode in Mode]
    limited = simulate_fleet(fc)
    unlimited = simulate_fleet(FleetConfig(**{**asdict(fc), "wait_limit_s": None}))
    summaries = [summarize(r) for r in runs]
    fleet = fleet_figures(limited, unlimited)
    if args.json:
        print(json.dumps({"replica": [asdict(s) for s in summaries], "fleet": fleet}, indent=2))
    else:
        _print_tables(summaries, fleet, lab, fc)
    if not args.no_plots:
        from infra.planning.lab.plot import plot_fleet, plot_run

        top = max(s.longest_step_ms for s in summaries) * 1.05
        paths = [plot_run(r, args.out / f"replica-{r.mode}.png", top) for r in runs]
        paths.append(plot_fleet(limited, unlimited, args.out / "fleet-spike.png"))
        for p in paths:
            print(f"wrote {p}")
    return 0
