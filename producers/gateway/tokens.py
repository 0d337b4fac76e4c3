"""Bearer tokens as one gateway sees them: lookups cached, revocations heard from every gateway.

A lookup is one or two Cassandra reads, so each gateway keeps what it found for ``CACHE_S`` (never past
the token's expiry). A revocation must not wait for that: the revoking gateway (or ``parley token revoke``)
deletes the lookup row, then publishes the token's hash on the Redis channel ``keys.tokens_revoked()``;
every gateway subscribes, drops the entry and counts itself in ``keys.token_dropped``, and the revocation is
answered once every gateway that received the message has (``announce_revoked``, half a second at most): a
request sent after the answer is refused at every gateway, not only once each has read its channel. Two guards
keep the cache exact besides:

- while the subscription is down (Redis restarting), the gateway caches nothing and dropped all it had,
  so a revocation it could not hear costs one lookup per request instead of a stale answer;
- a lookup that began before a revocation was heard is not cached (a counter of revocations heard), so a
  read racing the delete cannot put the token back for ``CACHE_S``.

Cost: one SHA-256 per request (the cache is keyed by the hash, as the revocation names it), one Redis
connection per gateway; per revocation, one message, one counter write per gateway and a read or two.
"""
from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from infra.stores import keys
from infra.stores.accounts import Accounts, User, announce_revoked, hash_token
from infra.stores.following import FollowedCache

log = logging.getLogger(__name__)
CACHE_S = 60.0


class TokenCache(FollowedCache):
    """Bearer tokens looked up, cached only while revocations can be heard (``keys.tokens_revoked()``); a
    lookup spanning a revocation or a loss of the channel is not cached."""

    channel = keys.tokens_revoked()
    lost_note = "caching no token until it is back"

    def __init__(self, accounts: Accounts, redis: Any, cache_s: float = CACHE_S) -> None:
        super().__init__(redis)
        self.accounts, self.cache_s = accounts, cache_s
        self._cache: dict[str, tuple[float, User]] = {}
        self._saying: set[asyncio.Future[None]] = set()  # "dropped" counts in flight, kept from the collector

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

    def forget(self, token_hash: str) -> None:
        self.heard += 1
        self._cache.pop(token_hash, None)

    def announced(self, token_hash: str) -> None:
        """A revocation heard (this gateway's own too): dropped, and said so for the revoker waiting on it."""
        self.forget(token_hash)
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # heard outside a loop (never while following the channel): nobody waits
            return
        task = loop.create_task(self._say_dropped(token_hash))
        self._saying.add(task)
        task.add_done_callback(self._saying.discard)

    async def _say_dropped(self, token_hash: str) -> None:
        """Count this gateway among those that dropped ``token_hash``: the revocation waits for all of them."""
        key = keys.token_dropped(token_hash)
        try:
            pipe = self.redis.pipeline(transaction=False)
            pipe.incr(key)
            pipe.expire(key, 60)
            await pipe.execute()
        except Exception as exc:  # noqa: BLE001 - the revocation stops waiting after its bound; nothing is lost
            log.warning("dropped revoked token %s… but could not say so (%s)", token_hash[:8], type(exc).__name__)

    def forget_all(self) -> None:
        self.heard += 1
        self._cache.clear()

    async def revoke(self, user_id: str, token_id: str) -> bool:
        """Revoke one of the user's tokens on every gateway; False when the user has no such token."""
        token_hash = await self.accounts.revoke(user_id, token_id)
        if token_hash is None:
            return False
        self.forget(token_hash)
        await announce_revoked(self.redis, token_hash)
        return True
