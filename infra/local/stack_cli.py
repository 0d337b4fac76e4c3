"""`parley up`, `parley down`, `parley status`: the local stack and the service from the command line.

    parley up                   backbone, migrations, topics, then workers, stages, gateway; demo user
    parley up --no-workers      the same without the generation workers
    parley up --backbone-only   Kafka, Cassandra, Redis (with migrations and topics) only
    parley down                 stop gateway, stages, workers, then the backbone
    parley down --keep-backbone stop only the service processes
    parley status               the backbone and the service processes; exit 0 when all answer
"""

from __future__ import annotations

import argparse
import logging
import time

from rich.console import Console
from rich.table import Table

from infra.config.settings import Settings
from infra.local import stack
from infra.local.errors import StackError
from infra.local.services import apps


def add_arguments(parser: argparse.ArgumentParser, name: str) -> None:
    if name == "up":
        parser.add_argument(
            "--timeout",
            type=float,
            default=stack.START_TIMEOUT_S,
            help="seconds to wait for each backbone service to answer (default %(default)s)",
        )
        parser.add_argument(
            "--worker-timeout",
            type=float,
            default=apps.WORKER_TIMEOUT_S,
            help="seconds to wait for each generation worker to load its engine (default %(default)s)",
        )
        parser.add_argument(
            "--gateways",
            type=int,
            default=1,
            metavar="N",
            help="run N gateways behind HAProxy (Debian's package) on the gateway port; each tails only its "
            "share of chat.tokens (default %(default)s: one gateway, no balancer)",
        )
        parser.add_argument(
            "--with-prometheus",
            action="store_true",
            help="also run Prometheus (Debian's package) scraping every process (port: see docs/configuration.md)",
        )
        which = parser.add_mutually_exclusive_group()
        which.add_argument(
            "--backbone-only",
            action="store_true",
            help="start only Kafka, Cassandra and Redis (and apply migrations and topics)",
        )
        which.add_argument(
            "--no-workers",
            action="store_true",
            help="start the stages process and the gateway, but no generation workers",
        )
    elif name == "down":
        parser.add_argument(
            "--timeout",
            type=float,
            default=stack.STOP_TIMEOUT_S,
            help="seconds to wait after SIGTERM before SIGKILL for a backbone service (default %(default)s)",
        )
        parser.add_argument(
            "--keep-backbone",
            action="store_true",
            help="stop only the service processes (gateway, stages, workers); leave Kafka, Cassandra, Redis",
        )


def _table(statuses: list[stack.ServiceStatus], with_time: bool = False) -> Table:
    table = Table(show_header=True, header_style="bold")
    for col in ("service", "address", "version", "state", *(["time"] if with_time else []), "detail"):
        table.add_column(col)
    for s in statuses:
        state = "[green]ok[/green]" if s.ok else "[red]down[/red]"
        timing = [f"{s.seconds:.1f} s" if s.seconds is not None else ""] if with_time else []
        table.add_row(s.name, s.address, s.version or "-", state, *timing, s.detail)
    return table


def _process_table(procs: list[stack.ProcessStatus], with_time: bool = False) -> Table:
    table = Table(show_header=True, header_style="bold")
    for col in ("process", "pid", "port", "metrics", "state", *(["time"] if with_time else []), "detail"):
        table.add_column(col)
    for p in procs:
        if p.running:
            state = "[green]running[/green]" if p.ready else "[yellow]starting[/yellow]"
        else:
            state = "[red]not running[/red]" if p.started_by_up else "[dim]not running[/dim]"
        timing = [f"{p.seconds:.1f} s" if p.seconds is not None else ""] if with_time else []
        metrics = f":{p.metrics_port}/metrics" if p.metrics_port else "-"
        table.add_row(
            p.name, str(p.pid) if p.pid else "-", str(p.port) if p.port else "-", metrics, state, *timing, p.detail
        )
    return table


def _print_welcome(console: Console, report: stack.ServiceReport, settings: Settings) -> None:
    console.print(f"[bold]Parley is running:[/bold] {report.url}")
    console.print(f"API docs:          {report.docs_url}")
    if report.demo is not None:
        origin = "created" if report.demo_is_new else "from"
        console.print(
            f"demo user ({report.demo.plan} plan, {origin} {stack.demo_file(settings)}): "
            f"{report.demo.user_id}"
        )
        console.print(f"bearer token:      {report.demo.token}", highlight=False)
    if any(p.name == "prometheus" for p in report.processes):
        console.print(f"Prometheus:        http://{settings.host}:{settings.ports.prometheus}/ "
                      "(`parley report` draws a run from it)")
    console.print(f"logs:              {settings.state_dir / 'logs'}")
    console.print("stop with: infra/parley down")


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    console = Console()
    settings = Settings.from_env()
    began = time.monotonic()
    try:
        if args.command == "up":
            return _up(args, settings, console, began)
        if args.command == "down":
            for line in stack.down(settings, timeout=args.timeout, keep_backbone=args.keep_backbone):
                console.print(line)
            console.print(f"down in {time.monotonic() - began:.1f} s")
            return 0
        if args.command == "status":
            return _status(settings, console)
    except StackError as exc:
        console.print(f"[bold red]parley {args.command} failed:[/bold red] {exc.message}")
        if exc.hint:
            console.print(f"[yellow]fix:[/yellow] {exc.hint}")
        if exc.log_tail:
            console.print("[dim]last log lines:[/dim]")
            console.out(exc.log_tail, highlight=False)
        return 1
    raise SystemExit(f"unknown command {args.command!r}")


def _up(args: argparse.Namespace, settings: Settings, console: Console, began: float) -> int:
    if args.backbone_only:
        statuses = stack.up(settings, console=console, timeout=args.timeout)
        console.print(_table(statuses, with_time=True))
        console.print(
            f"[bold]stack up in {time.monotonic() - began:.1f} s[/bold] "
            f"(state {settings.state_dir}, cache {settings.cache_dir})"
        )
        return 0 if all(s.ok for s in statuses) else 1
    report = stack.up_service(
        settings.with_(gateway_count=args.gateways) if args.gateways > 1 else settings,
        console=console,
        workers=not args.no_workers,
        timeout=args.timeout,
        worker_timeout=args.worker_timeout,
        with_prometheus=args.with_prometheus,
    )
    console.print(_table(report.backbone, with_time=True))
    console.print(_process_table(report.processes, with_time=True))
    console.print(
        f"[bold]up in {time.monotonic() - began:.1f} s[/bold] "
        f"(state {settings.state_dir}, cache {settings.cache_dir})"
    )
    _print_welcome(console, report, settings)
    ok = all(s.ok for s in report.backbone) and all(p.running for p in report.processes)
    return 0 if ok else 1


def _status(settings: Settings, console: Console) -> int:
    statuses = stack.status(settings)
    procs = stack.status_apps(settings)
    console.print(_table(statuses))
    console.print(_process_table(procs))
    ok = all(s.ok for s in statuses) and all(p.running for p in procs if p.started_by_up)
    return 0 if ok else 1
