"""``parley user create --plan free|paid|private``: make an account and print its bearer token (shown once) and
the token's id and expiry (``parley token list``/``revoke`` name it by that id)."""
from __future__ import annotations

import argparse
import asyncio

from infra.config.settings import Settings
from infra.stores.accounts import Accounts, Issued, User
from infra.stores.session import AsyncSession, connect


def add_arguments(parser: argparse.ArgumentParser, name: str) -> None:
    actions = parser.add_subparsers(dest="action", required=True)
    create = actions.add_parser("create", help="create a user and print a bearer token")
    create.add_argument("--plan", choices=("free", "paid", "private"), default="free")
    create.add_argument("--name", default=None, help="display name")


async def _create(settings: Settings, plan: str, name: str | None) -> tuple[User, Issued]:
    cluster, session = connect(settings)
    try:
        return await Accounts(AsyncSession(session), settings.token_ttl_days).create_account(plan, name)
    finally:
        cluster.shutdown()


def run(args: argparse.Namespace) -> int:
    user, issued = asyncio.run(_create(Settings.from_env(), args.plan, args.name))
    print(f"user_id: {user.user_id}\nplan:    {args.plan}\ntoken:   {issued.token}\n"
          f"token_id: {issued.token_id}\nexpires: {issued.expires_at:%Y-%m-%d %H:%M} UTC")
    return 0
