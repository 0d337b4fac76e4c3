"""``parley stages``: every pipeline stage but the workers and the gateway, in one process.

Each stage keeps its own consumer group, so any of them can later run as its own
deployment (``--only NAME``) without changing a line.
"""
from __future__ import annotations

import argparse
import asyncio
import signal

from infra.config import logs as logconfig
from infra.config.settings import Settings
from infra.local.wiring import PIPELINE, build_stages
from topics.runner import run_stages

STAGES = tuple(PIPELINE)


def add_arguments(parser: argparse.ArgumentParser, name: str) -> None:
    parser.add_argument("--only", action="append", choices=STAGES, help="run just these stages (repeatable)")
    parser.add_argument("--metrics-port", type=int, default=None,
                        help="serve Prometheus /metrics (the input check's counters and latency) on this port")


def run(args: argparse.Namespace) -> int:
    settings = Settings.from_env()
    logconfig.configure(settings.debug)
    if args.metrics_port is not None:
        from prometheus_client import start_http_server

        start_http_server(args.metrics_port, addr="127.0.0.1")
    asyncio.run(_main(settings, tuple(args.only or STAGES)))
    return 0


async def _main(settings: Settings, names: tuple[str, ...]) -> None:
    stages, close = await build_stages(settings, names)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, lambda: [s.stop() for s in stages])
    print(f"stages ready: {', '.join(names)}", flush=True)
    try:
        await run_stages(*stages)
    finally:
        await close()
