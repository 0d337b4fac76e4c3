"""``parley user create --plan free|paid|private``: make an account and print its bearer token (shown once)."""
from __future__ import annotations

import argparse
import asyncio

from infra.config.settings import Settings
from infra.stores.accounts import Accounts
from infra.stores.session import AsyncSession, connect


def add_arguments(parser: argparse.ArgumentParser, name: str) -> None:
    actions = parser.add_subparsers(dest="action", required=True)
    create = actions.add_parser("create", help="create a user and print a bearer token")
    create.add_argument("--plan", choices=("free", "paid", "private"), default="free")
    create.add_argument("--name", default=None, help="display name")


async def _create(settings: Settings, plan: str, name: str | None) -> tuple[str, str]:
    cluster, session = connect(settings)
    try:
        user, token = await Accounts(AsyncSession(session)).create_user(plan, name)
        return user.user_id, token
    finally:
        cluster.shutdown()


def run(args: argparse.Namespace) -> int:
    user_id, token = asyncio.run(_create(Settings.from_env(), args.plan, args.name))
    print(f"user_id: {user_id}\nplan:    {args.plan}\ntoken:   {token}")
    return 0
