"""``parley stages``: every pipeline stage but the workers and the gateway, in one process.

Each stage keeps its own consumer group, so any of them can later run as its own
deployment (``--only NAME``) without changing a line. The process serves every stage's
metrics (labelled ``stage``), the consumer lag of every group and the reservations
outstanding on one port (``Settings.ports.stages_metrics``, 9101).
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import signal
from pathlib import Path

from infra.config import logs as logconfig
from infra.config.settings import Settings
from infra.local.loop import run as run_loop
from infra.local.wiring import PIPELINE, build_stages
from infra.stores.retry import HEALTH
from topics.runner import run_stages

STAGES = tuple(PIPELINE)


def add_arguments(parser: argparse.ArgumentParser, name: str) -> None:
    parser.add_argument("--only", action="append", choices=STAGES, help="run just these stages (repeatable)")
    parser.add_argument("--metrics-port", type=int, default=None,
                        help="Prometheus /metrics port (default: the configured stages metrics port, 9101; 0: any)")
    parser.add_argument("--metrics-host", default="127.0.0.1", help="address /metrics listens on")


def run(args: argparse.Namespace) -> int:
    settings = Settings.from_env()
    logconfig.configure("stages", settings)
    port = settings.ports.stages_metrics if args.metrics_port is None else args.metrics_port
    run_loop(_main(settings, tuple(args.only or STAGES), port, args.metrics_host))
    return 0


def health_path(settings: Settings) -> Path:
    return settings.state_dir / "run" / "stages.health.json"


def write_health(settings: Settings, waiting: dict[str, tuple[str, float]]) -> None:
    """Which stage waits for which store, since when (empty: all healthy)."""
    path = health_path(settings)
    path.parent.mkdir(parents=True, exist_ok=True)
    body = {stage: {"waiting_for": dep, "since": since} for stage, (dep, since) in waiting.items()}
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(body))
    tmp.replace(path)


async def _main(settings: Settings, names: tuple[str, ...], metrics_port: int, metrics_host: str) -> None:
    import redis.asyncio as aioredis

    from infra.local import telemetry

    port = telemetry.serve(metrics_port, metrics_host)
    stages, close = await build_stages(settings, names)
    HEALTH.listeners.append(lambda waiting: write_health(settings, waiting))
    write_health(settings, {})
    redis = aioredis.Redis.from_url(settings.redis_url)
    poll = asyncio.create_task(telemetry.poll(settings, redis), name="telemetry")
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, lambda: [s.stop() for s in stages])
    print(f"stages ready: {', '.join(names)} metrics_port={port}", flush=True)
    try:
        await run_stages(*stages)
    finally:
        poll.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await poll
        await redis.aclose()
        await close()
