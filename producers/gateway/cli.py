"""``parley gateway``: one stateless HTTP gateway on uvicorn."""
from __future__ import annotations

import argparse

import uvicorn

from infra.config import logs as logconfig
from infra.config.settings import Settings


def add_arguments(parser: argparse.ArgumentParser, name: str) -> None:
    parser.add_argument("--port", type=int, default=None, help="default: PARLEY_GATEWAY_PORT or 8000")
    parser.add_argument("--host", default="127.0.0.1")


def run(args: argparse.Namespace) -> int:
    logconfig.configure()
    settings = Settings.from_env()
    uvicorn.run(build(settings), host=args.host, port=args.port or settings.ports.gateway, log_level="warning",
                access_log=False)
    return 0


def build(settings: Settings):  # type: ignore[no-untyped-def]
    from infra.config.pools import load_pools
    from producers.gateway.app import create_app

    pools = load_pools(settings)
    return create_app(settings, {name: cfg.served_model_name for name, cfg in pools.items()},
                      quota=_quota(settings))


def _quota(settings: Settings) -> object | None:
    try:
        from infra.stores.quota import Quota
    except ImportError:
        return None
    import redis.asyncio as aioredis

    from infra.config.plans import load_plans

    # The deployment's scope: a release touches the scoped expiry set, like admission and settlement.
    return Quota.configured(aioredis.Redis.from_url(settings.redis_url), load_plans(), scope=settings.topic_prefix)
