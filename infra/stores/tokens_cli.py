"""``parley token list --user U`` (ids, names, status and dates, never a secret) and ``parley token revoke ID``
(the token stops working at once on every gateway: the lookup row goes, then the gateways are told over
Redis to drop it from their caches)."""
from __future__ import annotations

import argparse
import asyncio
from datetime import UTC, datetime

import redis.asyncio as aioredis

from infra.config.settings import Settings
from infra.stores.accounts import Accounts, TokenInfo, announce_revoked
from infra.stores.session import AsyncSession, connect


def add_arguments(parser: argparse.ArgumentParser, name: str) -> None:
    actions = parser.add_subparsers(dest="action", required=True)
    listing = actions.add_parser("list", help="a user's tokens: id, name, status, dates (no secret)")
    listing.add_argument("--user", required=True, help="the user id")
    revoke = actions.add_parser("revoke", help="revoke a token by its id, at once on every gateway")
    revoke.add_argument("token_id")


def line(t: TokenInfo, now: datetime) -> str:
    def day(at: datetime | None) -> str:
        return at.strftime("%Y-%m-%d %H:%M") if at else "-"
    return f"{t.token_id}  {t.status(now):8} created {day(t.created_at)}  expires {day(t.expires_at)}  {t.name or ''}"


async def _list(settings: Settings, user_id: str) -> list[str]:
    cluster, session = connect(settings)
    try:
        now = datetime.now(UTC)
        return [line(t, now) for t in await Accounts(AsyncSession(session)).tokens_of(user_id)]
    finally:
        cluster.shutdown()


async def _revoke(settings: Settings, token_id: str) -> bool:
    cluster, session = connect(settings)
    redis = aioredis.Redis.from_url(settings.redis_url)
    try:
        accounts = Accounts(AsyncSession(session))
        user_id = await accounts.owner_of_token(token_id)
        token_hash = await accounts.revoke(user_id, token_id) if user_id else None
        if token_hash is not None:
            await announce_revoked(redis, token_hash)
        return token_hash is not None
    finally:
        await redis.aclose()
        cluster.shutdown()


def run(args: argparse.Namespace) -> int:
    settings = Settings.from_env()
    if args.action == "list":
        lines = asyncio.run(_list(settings, args.user))
        print("\n".join(lines) if lines else f"no tokens for user {args.user}")
        return 0
    if not asyncio.run(_revoke(settings, args.token_id)):
        print(f"no token {args.token_id}")
        return 1
    print(f"revoked {args.token_id}")
    return 0
