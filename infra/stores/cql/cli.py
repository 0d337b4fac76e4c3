"""``parley migrate``: apply pending CQL migrations to the configured keyspace."""
from __future__ import annotations

import argparse

from infra.config.settings import Settings, env_var
from infra.stores.cql.migrate import apply


def add_arguments(parser: argparse.ArgumentParser, name: str) -> None:
    parser.add_argument("--keyspace", help=f"override {env_var('KEYSPACE')}")


def run(args: argparse.Namespace) -> int:
    settings = Settings.from_env()
    if args.keyspace:
        settings = settings.with_(keyspace=args.keyspace)
    applied = apply(settings)
    print(f"keyspace {settings.keyspace}: applied {applied or 'nothing (up to date)'}")
    return 0
