"""Users and their API tokens. Tokens are shown once and stored as SHA-256 hashes."""
from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass
from datetime import UTC, datetime

from infra.stores.session import AsyncSession
from schemas import new_id

TOKEN_PREFIX = "pk_"


@dataclass(frozen=True)
class User:
    user_id: str
    plan: str
    display_name: str | None = None


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


class Accounts:
    def __init__(self, db: AsyncSession) -> None:
        self.db = db

    async def create_user(self, plan: str, display_name: str | None = None) -> tuple[User, str]:
        """A new user and a fresh bearer token (the only time the token is visible)."""
        if plan not in ("free", "paid", "private"):
            raise ValueError(f"plan must be 'free', 'paid' or 'private', not {plan!r}")
        user = User(new_id(), plan, display_name)
        now = datetime.now(UTC)
        await self.db.execute(
            "INSERT INTO users (user_id, plan, display_name, created_at) VALUES (?, ?, ?, ?)",
            (user.user_id, plan, display_name, now),
        )
        return user, await self.issue_token(user.user_id)

    async def issue_token(self, user_id: str) -> str:
        token = TOKEN_PREFIX + secrets.token_urlsafe(32)
        await self.db.execute(
            "INSERT INTO api_tokens (token_hash, user_id, created_at) VALUES (?, ?, ?)",
            (hash_token(token), user_id, datetime.now(UTC)),
        )
        return token

    async def get_user(self, user_id: str) -> User | None:
        rows = await self.db.execute("SELECT user_id, plan, display_name FROM users WHERE user_id = ?", (user_id,))
        return User(rows[0].user_id, rows[0].plan, rows[0].display_name) if rows else None

    async def user_for_token(self, token: str) -> User | None:
        rows = await self.db.execute("SELECT user_id FROM api_tokens WHERE token_hash = ?", (hash_token(token),))
        return await self.get_user(rows[0].user_id) if rows else None
