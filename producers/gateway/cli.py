"""``parley gateway``: one stateless HTTP gateway on uvicorn."""
from __future__ import annotations

import argparse

import redis.asyncio as aioredis
import uvicorn
from fastapi import FastAPI

from infra.config import logs as logconfig
from infra.config.plans import load_plans
from infra.config.pools import load_pools
from infra.config.settings import Settings, env_var
from infra.stores.quota import Quota
from producers.gateway.app import create_app


def add_arguments(parser: argparse.ArgumentParser, name: str) -> None:
    parser.add_argument("--port", type=int, default=None, help=f"default: {env_var('GATEWAY_PORT')} or 8000")
    parser.add_argument("--host", default="127.0.0.1")


def run(args: argparse.Namespace) -> int:
    settings = Settings.from_env()
    logconfig.configure("gateway", settings)
    uvicorn.run(build(settings), host=args.host, port=args.port or settings.ports.gateway, log_level="warning",
                access_log=False)
    return 0


def build(settings: Settings) -> FastAPI:
    pools = load_pools(settings)
    # The deployment's scope: a release touches the scoped expiry set, like admission and settlement.
    quota = Quota.configured(aioredis.Redis.from_url(settings.redis_url), load_plans(settings.plans_file), settings)
    return create_app(settings, {name: cfg.served_model_name for name, cfg in pools.items()}, quota=quota)
