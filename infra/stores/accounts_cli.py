"""``parley user create --plan free|paid|private``: make an account and print its bearer token (shown once) and
the token's id and expiry (``parley token list``/``revoke`` name it by that id). Cassandra down or too slow is one
line on stderr and exit 3, never a traceback."""
from __future__ import annotations

import argparse
import asyncio
import sys

from infra.config.settings import Settings
from infra.stores.accounts import Accounts, Issued, User
from infra.stores.retry import CASSANDRA_DOWN
from infra.stores.session import AsyncSession, connect

UNREACHABLE = 3


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
    settings = Settings.from_env()
    try:
        user, issued = asyncio.run(_create(settings, args.plan, args.name))
    except CASSANDRA_DOWN as err:
        print(f"parley user create: {outage_line(err, settings)}", file=sys.stderr)
        return UNREACHABLE
    print(f"user_id: {user.user_id}\nplan:    {args.plan}\ntoken:   {issued.token}\n"
          f"token_id: {issued.token_id}\nexpires: {issued.expires_at:%Y-%m-%d %H:%M} UTC")
    return 0


def outage_line(err: BaseException, settings: Settings) -> str:
    """What a person reads when Cassandra cannot be reached or did not answer in time (no token was shown)."""
    where = f"{','.join(settings.cassandra_contact_points)}:{settings.ports.cassandra}"
    if type(err).__name__ == "NoHostAvailable":
        return (f"cannot reach Cassandra at {where} (NoHostAvailable), so no user was made. "
                "Is it running? `parley status` says.")
    return (f"Cassandra at {where} did not answer in time ({type(err).__name__}), so no token was shown; "
            "run the command again once `parley status` says Cassandra is up.")
