"""Users and their API tokens.

A token is shown once, when it is made, and stored only as its SHA-256 hash (``api_tokens``, the lookup
every request makes). Each has an id to name it by, a name, and an expiry (``Settings.token_ttl_days`` unless
the maker asks for less or more, up to ``MAX_TTL_DAYS``); ``api_tokens_by_user`` lists a user's tokens, never
their secret. Revoking deletes the lookup row, so the next lookup fails, and stamps the list.
"""
from __future__ import annotations

import asyncio
import hashlib
import logging
import secrets
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, cast

from infra.stores import keys
from infra.stores.session import AsyncSession
from schemas import new_id
from schemas.errors import ParleyError
from schemas.gateway import PlanName

log = logging.getLogger(__name__)
# How long a revocation waits for every gateway that received it to say it dropped the token: each says so within
# a millisecond or two of hearing it, so this is only reached when one is stalled (then it is told, and forgets
# the token by its own 60 s bound or its next lost channel at the latest).
DROPPED_WAIT_S = 0.5
DROPPED_POLL_S = 0.005

TOKEN_PREFIX = "pk_"
DEFAULT_TTL_DAYS = 90
MAX_TTL_DAYS = 3650
MAX_LIVE_TOKENS = 50  # per user: enough for every device and script, not a table one user can flood


@dataclass(frozen=True)
class User:
    user_id: str
    plan: PlanName
    display_name: str | None = None


@dataclass(frozen=True)
class Issued:
    """A token just made: the only moment its secret exists outside the caller's hands."""

    token: str
    token_id: str
    expires_at: datetime


@dataclass(frozen=True)
class Bearer:
    """Who a token speaks for, and until when (a token made before tokens had an expiry: its creation plus the
    configured life)."""

    user: User
    token_hash: str
    expires_at: datetime | None


@dataclass(frozen=True)
class TokenInfo:
    """One line of a user's token list: no secret, no hash."""

    token_id: str
    name: str | None
    created_at: datetime | None
    expires_at: datetime | None
    revoked_at: datetime | None

    def status(self, now: datetime) -> str:
        if self.revoked_at is not None:
            return "revoked"
        return "expired" if self.expires_at is not None and self.expires_at <= now else "active"


class TooManyTokens(ParleyError):
    """The user already holds ``MAX_LIVE_TOKENS`` live tokens."""

    status = 409  # as the gateway answers it


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def _utc(at: datetime | None) -> datetime | None:
    """Cassandra hands timestamps back naive (in UTC)."""
    return at.replace(tzinfo=UTC) if at is not None and at.tzinfo is None else at


class Accounts:
    def __init__(self, db: AsyncSession, token_ttl_days: int = DEFAULT_TTL_DAYS) -> None:
        self.db, self.token_ttl_days = db, token_ttl_days

    async def create_account(self, plan: str, display_name: str | None = None) -> tuple[User, Issued]:
        """A new user and a fresh bearer token (the only time the token is visible)."""
        if plan not in ("free", "paid", "private"):
            raise ValueError(f"plan must be 'free', 'paid' or 'private', not {plan!r}")
        user = User(new_id(), cast(PlanName, plan), display_name)  # checked just above
        await self.db.execute(
            "INSERT INTO users (user_id, plan, display_name, created_at) VALUES (?, ?, ?, ?)",
            (user.user_id, plan, display_name, datetime.now(UTC)),
        )
        return user, await self.issue(user.user_id)

    async def create_user(self, plan: str, display_name: str | None = None) -> tuple[User, str]:
        user, issued = await self.create_account(plan, display_name)
        return user, issued.token

    async def issue(self, user_id: str, name: str | None = None, ttl_days: int | None = None) -> Issued:
        """A new token for ``user_id`` lasting ``ttl_days`` (default: the configured life)."""
        days = self.token_ttl_days if ttl_days is None else ttl_days
        if not 1 <= days <= MAX_TTL_DAYS:
            raise ValueError(f"a token lasts 1 to {MAX_TTL_DAYS} days, not {days}")
        now = datetime.now(UTC)
        token, token_id, expires = TOKEN_PREFIX + secrets.token_urlsafe(32), new_id(), now + timedelta(days=days)
        token_hash = hash_token(token)
        await self.db.execute("INSERT INTO api_token_ids (token_id, user_id) VALUES (?, ?)", (token_id, user_id))
        await self.db.execute(
            "INSERT INTO api_tokens_by_user (user_id, token_id, token_hash, name, created_at, expires_at) "
            "VALUES (?, ?, ?, ?, ?, ?)", (user_id, token_id, token_hash, name, now, expires))
        await self.db.execute(
            "INSERT INTO api_tokens (token_hash, user_id, created_at, token_id, expires_at) VALUES (?, ?, ?, ?, ?)",
            (token_hash, user_id, now, token_id, expires))
        return Issued(token, token_id, expires)

    async def issue_token(self, user_id: str) -> str:
        return (await self.issue(user_id)).token

    async def issue_limited(self, user_id: str, name: str | None = None, ttl_days: int | None = None) -> Issued:
        """``issue``, refused with ``TooManyTokens`` when the user already holds ``MAX_LIVE_TOKENS`` live ones."""
        now = datetime.now(UTC)
        if sum(t.status(now) == "active" for t in await self.tokens_of(user_id)) >= MAX_LIVE_TOKENS:
            raise TooManyTokens(user_id)
        return await self.issue(user_id, name, ttl_days)

    async def get_user(self, user_id: str) -> User | None:
        rows = await self.db.execute("SELECT user_id, plan, display_name FROM users WHERE user_id = ?", (user_id,))
        return User(rows[0].user_id, rows[0].plan, rows[0].display_name) if rows else None

    async def bearer(self, token: str, now: datetime | None = None) -> Bearer | None:
        """The user a live token speaks for; None for an unknown, revoked or expired one."""
        token_hash = hash_token(token)
        rows = await self.db.execute("SELECT user_id, created_at, expires_at FROM api_tokens WHERE token_hash = ?",
                                     (token_hash,))
        if not rows:
            return None
        expires, made = _utc(rows[0].expires_at), _utc(rows[0].created_at)
        if expires is None and made is not None:  # made before tokens had an expiry
            expires = made + timedelta(days=self.token_ttl_days)
        if expires is not None and expires <= (now or datetime.now(UTC)):
            return None
        user = await self.get_user(rows[0].user_id)
        return Bearer(user, token_hash, expires) if user is not None else None

    async def user_for_token(self, token: str) -> User | None:
        bearer = await self.bearer(token)
        return bearer.user if bearer else None

    async def tokens_of(self, user_id: str) -> list[TokenInfo]:
        """The user's tokens, newest first: ids, names and dates, never a secret or a hash."""
        rows = await self.db.execute(
            "SELECT token_id, name, created_at, expires_at, revoked_at FROM api_tokens_by_user WHERE user_id = ?",
            (user_id,))
        return [TokenInfo(r.token_id, r.name, _utc(r.created_at), _utc(r.expires_at), _utc(r.revoked_at))
                for r in rows]

    async def owner_of_token(self, token_id: str) -> str | None:
        rows = await self.db.execute("SELECT user_id FROM api_token_ids WHERE token_id = ?", (token_id,))
        return rows[0].user_id if rows else None

    async def revoke(self, user_id: str, token_id: str) -> str | None:
        """Revoke one of ``user_id``'s tokens: its hash (for the gateways' caches to drop), or None when the user
        has no such token. Revoking again is harmless."""
        rows = await self.db.execute(
            "SELECT token_hash, revoked_at FROM api_tokens_by_user WHERE user_id = ? AND token_id = ?",
            (user_id, token_id))
        if not rows:
            return None
        token_hash = rows[0].token_hash
        await self.db.execute("DELETE FROM api_tokens WHERE token_hash = ?", (token_hash,))  # the lookup first
        if rows[0].revoked_at is None:
            await self.db.execute("UPDATE api_tokens_by_user SET revoked_at = ? WHERE user_id = ? AND token_id = ?",
                                  (datetime.now(UTC), user_id, token_id))
        return str(token_hash)


async def announce_revoked(redis: Any, token_hash: str, wait_s: float = DROPPED_WAIT_S) -> bool:
    """Tell every gateway to drop a revoked token from its cache (its lookup row is already gone), and wait, at
    most ``wait_s``, until each gateway that received the message has said it dropped it (``keys.token_dropped``):
    the revocation's answer then means the very next request is refused at every gateway, not only once each has
    read its channel. True when every one said so."""
    received = int(await redis.publish(keys.tokens_revoked(), token_hash) or 0)
    deadline = time.monotonic() + wait_s
    while received:
        if int(await redis.get(keys.token_dropped(token_hash)) or 0) >= received:
            return True
        if time.monotonic() >= deadline:
            log.warning("revoked token %s…: not every gateway said it dropped it within %.1f s", token_hash[:8],
                        wait_s)
            return False
        await asyncio.sleep(DROPPED_POLL_S)
    return True
