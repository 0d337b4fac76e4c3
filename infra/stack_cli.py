"""`parley up`, `parley down`, `parley status`: the local stack from the command line."""

from __future__ import annotations

import argparse
import logging
import time

from rich.console import Console
from rich.table import Table

from infra import stack
from infra.errors import StackError
from infra.settings import Settings


def add_arguments(parser: argparse.ArgumentParser, name: str) -> None:
    if name == "up":
        parser.add_argument(
            "--timeout",
            type=float,
            default=stack.START_TIMEOUT_S,
            help="seconds to wait for each service to answer (default %(default)s)",
        )
    elif name == "down":
        parser.add_argument(
            "--timeout",
            type=float,
            default=stack.STOP_TIMEOUT_S,
            help="seconds to wait after SIGTERM before SIGKILL (default %(default)s)",
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


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    console = Console()
    settings = Settings.from_env()
    began = time.monotonic()
    try:
        if args.command == "up":
            statuses = stack.up(settings, console=console, timeout=args.timeout)
            console.print(_table(statuses, with_time=True))
            console.print(
                f"[bold]stack up in {time.monotonic() - began:.1f} s[/bold] "
                f"(state {settings.state_dir}, cache {settings.cache_dir})"
            )
            return 0 if all(s.ok for s in statuses) else 1
        if args.command == "down":
            for line in stack.down(settings, timeout=args.timeout):
                console.print(line)
            console.print(f"down in {time.monotonic() - began:.1f} s")
            return 0
        if args.command == "status":
            statuses = stack.status(settings)
            console.print(_table(statuses))
            return 0 if all(s.ok for s in statuses) else 1
    except StackError as exc:
        console.print(f"[bold red]parley {args.command} failed:[/bold red] {exc.message}")
        if exc.hint:
            console.print(f"[yellow]fix:[/yellow] {exc.hint}")
        if exc.log_tail:
            console.print("[dim]last log lines:[/dim]")
            console.out(exc.log_tail, highlight=False)
        return 1
    raise SystemExit(f"unknown command {args.command!r}")
