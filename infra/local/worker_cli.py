"""``parley worker --pool NAME``: one generation worker (one engine, vLLM or simulated, one replica of the pool)."""
from __future__ import annotations

import argparse
import asyncio
import signal
from typing import Any

from consumers.generation.coalescing import FlushPolicy
from consumers.generation.decisions import Limits
from consumers.generation.worker import GenerationWorker
from infra.config import logs as logconfig
from infra.config.pools import PoolConfig
from infra.config.settings import Settings
from infra.local.loop import run as run_loop
from infra.local.model import ready_pool


def add_arguments(parser: argparse.ArgumentParser, name: str) -> None:
    parser.add_argument("--pool", default="large", help="model pool this worker serves (infra/config/pools.toml)")
    parser.add_argument("--metrics-port", type=int, default=None,
                        help="Prometheus /metrics port (default: the pool's metrics_port; 0: any free one)")
    parser.add_argument("--metrics-host", default="127.0.0.1", help="address /metrics listens on")
    parser.add_argument("--capacity", type=int, default=None,
                        help="requests held at once (default: max_num_seqs and an eighth more)")


def run(args: argparse.Namespace) -> int:
    settings = Settings.from_env()
    logconfig.configure(f"worker-{args.pool}", settings)
    pool = ready_pool(args.pool, settings)
    run_loop(_serve(settings, pool, args))
    return 0


async def _serve(settings: Settings, pool: PoolConfig, args: argparse.Namespace) -> None:
    import redis.asyncio as aioredis

    from consumers.generation.engine import VllmEngine
    from consumers.generation.sim_engine import SimEngine
    from consumers.safety.classifier import EmbeddedClassifier
    from infra.config.pools import load_pools
    from infra.config.safety import RulesFile
    from infra.stores.sealing import configured
    from infra.stores.session import AsyncSession, connect

    classifier = EmbeddedClassifier(RulesFile(settings.safety_file))  # before the engine: a bad rules file fails fast
    cluster, session = connect(settings)  # the data keys: prompts arrive sealed, tokens leave sealed
    engine = SimEngine.for_pool(pool) if pool.engine == "sim" else VllmEngine(pool)
    limits = Limits(pool.name, pool.served_model_name, pool.max_model_len)
    sealer = configured(settings, AsyncSession(session), aioredis.Redis.from_url(settings.redis_url))
    worker = GenerationWorker(settings, limits, engine, args.capacity or pool.held_requests,
                              metrics_port=pool.metrics_port if args.metrics_port is None
                              else args.metrics_port, metrics_host=args.metrics_host, classifier=classifier,
                              sealer=sealer,
                              flush=flush_policy(pool),
                              on_ready=lambda w: print(f"worker ready pool={pool.name} "
                                                       f"metrics_port={w.metrics_port}", flush=True))
    sealer.keys.start()  # heard from the first request on, so a live key is read once
    standing = _stand_ins(settings, load_pools(settings), pool, engine, worker, classifier, args.capacity)

    def stop() -> None:
        if standing is not None:
            standing.cancel()  # first: a pool whose workers stop at the same time is not stood in for
        worker.stop()

    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop)
    try:
        await worker.run()
    finally:
        if standing is not None:
            standing.cancel()
            await asyncio.gather(standing, return_exceptions=True)  # each stand-in stopped, its group left
        await engine.close()
        cluster.shutdown()
    if worker.engine_failure is not None:
        raise SystemExit(f"worker {worker.worker_id}: the engine died ({worker.engine_failure}); exiting so its "
                         "supervisor starts it again")


def _stand_ins(settings: Settings, pools: dict[str, Any], pool: Any, engine: Any, worker: GenerationWorker,
               classifier: Any, capacity: int | None) -> asyncio.Task[None] | None:
    """The watch that stands this worker in for a pool that declares its pool compatible and has no replica
    left (consumers/generation/standin.py); None when no pool does."""
    import redis.asyncio as aioredis

    from consumers.generation.standin import StandIns
    from infra.config.pools import stand_ins_for
    from topics import Topics
    from topics.catalogue import GENERATION

    covered = stand_ins_for(pools, pool.name)
    if not covered:
        return None
    topics = Topics(settings.topic_prefix)

    def make(name: str) -> GenerationWorker:
        other = pools[name]
        return GenerationWorker(settings, Limits(name, other.served_model_name, other.max_model_len), engine,
                                capacity or pool.held_requests, worker_id=f"{worker.worker_id}+{name}",
                                classifier=classifier, sealer=worker.sealer, stand_in_from=pool.name,
                                flush=flush_policy(other))

    watch = StandIns(aioredis.Redis.from_url(settings.redis_url),
                     {name: topics.group(GENERATION, name) for name in covered}, make, worker.engine_died)
    return asyncio.create_task(watch.run(), name="stand-ins")


def flush_policy(pool: PoolConfig) -> FlushPolicy:
    """How the pool's workers make records of a reply's tokens (consumers/generation/coalescing.py)."""
    return FlushPolicy(window_s=pool.flush_ms / 1000, max_tokens=pool.flush_tokens, on_time=pool.flush_on_time,
                       together=pool.flush_together, stream_interval=pool.stream_interval,
                       drain_at_tick=pool.flush_drain, flush_groups=pool.flush_groups)
