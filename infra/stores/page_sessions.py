"""The page's server-side sessions, in Redis: a random id (the cookie) -> the user it signed in.

The cookie never holds the API token: a stolen cookie is one session, which sign-out (or its
expiry) ends, not a key to the API. Redis holds only the id's SHA-256, so a copy of Redis
hands out no live cookie.
"""
from __future__ import annotations

import hashlib
import secrets
from typing import Any

from infra.stores import keys


def _key(session_id: str) -> str:
    return keys.page_session(hashlib.sha256(session_id.encode()).hexdigest())


class PageSessions:
    def __init__(self, redis: Any, ttl_s: int) -> None:
        self.redis, self.ttl_s = redis, ttl_s

    async def create(self, user_id: str) -> str:
        session_id = secrets.token_urlsafe(32)  # 256 random bits
        await self.redis.set(_key(session_id), user_id, ex=self.ttl_s)
        return session_id

    async def user_id(self, session_id: str) -> str | None:
        if not session_id or len(session_id) > 128:
            return None
        raw = await self.redis.get(_key(session_id))
        return raw.decode() if raw is not None else None

    async def revoke(self, session_id: str) -> None:
        if session_id:
            await self.redis.delete(_key(session_id))
