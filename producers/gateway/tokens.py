"""Bearer tokens as one gateway sees them: lookups cached, revocations heard from every gateway.

A lookup is one or two Cassandra reads, so each gateway keeps what it found for ``CACHE_S`` (never past
the token's expiry). A revocation must not wait for that: the revoking gateway (or ``parley token revoke``)
deletes the lookup row, then publishes the token's hash on the Redis channel ``keys.tokens_revoked()``;
every gateway subscribes and drops the entry at once. Two guards keep that exact:

- while the subscription is down (Redis restarting), the gateway caches nothing and dropped all it had,
  so a revocation it could not hear costs one lookup per request instead of a stale answer;
- a lookup that began before a revocation was heard is not cached (a counter of revocations heard), so a
  read racing the delete cannot put the token back for ``CACHE_S``.

Cost: one SHA-256 per request (the cache is keyed by the hash, as the revocation names it), one Redis
connection per gateway, one message per revocation.
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Any

from redis.exceptions import RedisError

from infra.stores import keys
from infra.stores.accounts import Accounts, User, announce_revoked, hash_token

log = logging.getLogger(__name__)
CACHE_S = 60.0
RESUBSCRIBE_S = 1.0


class TokenCache:
    def __init__(self, accounts: Accounts, redis: Any, cache_s: float = CACHE_S) -> None:
        self.accounts, self.redis, self.cache_s = accounts, redis, cache_s
        self.subscribed = False  # caching only while revocations can be heard
        self.heard = 0  # revocations heard (and subscription losses): a lookup spanning one is not cached
        self._cache: dict[str, tuple[float, User]] = {}
        self._task: asyncio.Task[None] | None = None

    async def user(self, token: str) -> User | None:
        token_hash = hash_token(token)
        hit = self._cache.get(token_hash)
        if hit is not None and hit[0] > time.monotonic():
            return hit[1]
        heard = self.heard
        bearer = await self.accounts.bearer(token)
        if bearer is None:
            self._cache.pop(token_hash, None)
            return None
        if self.subscribed and heard == self.heard:
            until = time.monotonic() + self.cache_s
            if bearer.expires_at is not None:  # never past the token's own end
                until = min(until, time.monotonic() + (bearer.expires_at.timestamp() - time.time()))
            self._cache[token_hash] = (until, bearer.user)
        return bearer.user

    def drop(self, token_hash: str) -> None:
        self.heard += 1
        self._cache.pop(token_hash, None)

    def forget_all(self) -> None:
        self.heard += 1
        self._cache.clear()

    async def revoke(self, user_id: str, token_id: str) -> bool:
        """Revoke one of the user's tokens on every gateway; False when the user has no such token."""
        token_hash = await self.accounts.revoke(user_id, token_id)
        if token_hash is None:
            return False
        self.drop(token_hash)
        await announce_revoked(self.redis, token_hash)
        return True

    # -- the subscription --------------------------------------------------------------------------------
    def start(self) -> None:
        self._task = asyncio.create_task(self._listen())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _listen(self) -> None:
        while True:
            pubsub = self.redis.pubsub()
            try:
                await pubsub.subscribe(keys.tokens_revoked())
                async for message in pubsub.listen():
                    self.heard_message(message)
            except asyncio.CancelledError:
                raise
            except (RedisError, OSError) as exc:  # the subscription is lost: stop caching, try again
                log.warning("token revocation channel lost (%s); caching no token until it is back",
                            type(exc).__name__)
            finally:
                self.subscribed = False
                self.forget_all()
                with contextlib.suppress(Exception):
                    await pubsub.aclose()
            await asyncio.sleep(RESUBSCRIBE_S)

    def heard_message(self, message: dict[str, Any]) -> None:
        if message.get("type") == "subscribe":
            self.subscribed = True
        elif message.get("type") == "message":
            data = message.get("data")
            self.drop(data.decode() if isinstance(data, bytes) else str(data))
