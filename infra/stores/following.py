"""A per-process cache that another process can empty: it follows a Redis channel on which each process
announces what it destroyed (a conversation's data key, a revoked API token), and forgets each name it hears.

While the subscription holds, a cache may keep what it read for long; once it is lost nothing said meanwhile
is heard, so everything is forgotten and ``subscribed`` stays False until the channel is back (the caches then
keep entries only their short bound). ``heard`` counts names heard and losses: a read that spans one is not
kept long, since what it read may already be destroyed.
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

log = logging.getLogger(__name__)
RESUBSCRIBE_S = 1.0


class FollowedCache:
    channel: str  # the Redis channel names are announced on
    also: tuple[str, ...] = ()  # other channels followed on the same subscription (see ``heard_other``)
    lost_note: str  # what the cache does while the channel is lost, for the log

    def __init__(self, redis: Any) -> None:
        self.redis = redis
        self.subscribed = False  # names can be heard now
        self.heard = 0  # names heard and subscription losses
        self._task: asyncio.Task[None] | None = None
        self._confirmed: set[str] = set()  # channels whose subscription the server confirmed

    def forget(self, name: str) -> None:
        raise NotImplementedError

    def forget_all(self) -> None:
        raise NotImplementedError

    def announced(self, name: str) -> None:
        """A name announced on ``channel``: forgotten (a cache that answers the announcer says so here too)."""
        self.forget(name)

    def heard_other(self, channel: str, data: bytes) -> None:
        """A message on one of ``also``'s channels."""

    def start(self) -> None:
        """Follow the channel (once; without Redis, never)."""
        if self.redis is not None and self._task is None:
            self._task = asyncio.ensure_future(self._follow())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _follow(self) -> None:
        while True:
            pubsub = self.redis.pubsub()
            self._confirmed = set()
            try:
                await pubsub.subscribe(self.channel, *self.also)
                async for message in pubsub.listen():
                    self.heard_message(message)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - lost: keep nothing long until it is back
                log.warning("channel %s lost (%s); %s", self.channel, type(exc).__name__, self.lost_note)
            finally:
                self.subscribed = False
                self.forget_all()
                with contextlib.suppress(Exception):
                    await pubsub.aclose()
            await asyncio.sleep(RESUBSCRIBE_S)

    def heard_message(self, message: dict[str, Any]) -> None:
        channel = _text(message.get("channel", self.channel))
        if message.get("type") == "subscribe":  # subscribed once every channel is: nothing said is missed
            self._confirmed.add(channel)
            self.subscribed = {self.channel, *self.also} <= self._confirmed
        elif message.get("type") == "message" and channel == self.channel:
            self.announced(_text(message.get("data")))
        elif message.get("type") == "message" and channel in self.also:
            data = message.get("data")
            self.heard_other(channel, data if isinstance(data, bytes) else str(data).encode())


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
