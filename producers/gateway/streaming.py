"""One client's SSE stream of one generation: replay after an offset, then live, then the end.

Generation never waits for a client: this only reads. While it streams it keeps the
generation's reader heartbeat alive in Redis; when it stops (the client left), the
heartbeat lapses and the abandoned-reply detector cancels the reply after the timeout.
"""
from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncGenerator, Awaitable, Callable
from typing import Any

from redis.exceptions import RedisError

from producers.gateway.metrics import OPEN_STREAMS
from producers.gateway.pacing import paced
from producers.gateway.relay import Aged, TokenRelay
from producers.gateway.sse import KEEPALIVE, STOP_REASONS, frame, is_last, to_sse
from schemas import GenerationStarted, TokensAppended

STALL_S = 3.0  # no event this long while generating, and the worker's beat is gone: say so
LOST_AFTER_S = 2.0  # the beat missing this long (two of the worker's beats) in a stall: the worker is gone
KAFKA_QUIET_S = 3.0  # no fetch answered this long (six of the tail's long-polls): Kafka is unreachable from here
REDIS_GRACE_S = 5.0  # after Redis was unreachable, a missing beat is the outage's until the worker beats again
CHECK_EVERY_S = 1.0


async def follow(relay: TokenRelay, generation_id: str, *, after: int | None, since_ms: int,
                 queue: asyncio.Queue[tuple[int, Any]] | None, first: list[tuple[int, Any]] | None,
                 keepalive_s: float, beat_every_s: float, heartbeat: Callable[[], Awaitable[None]],
                 saved: Callable[[], Awaitable[list[bytes]]],
                 retracted: Callable[[], Awaitable[bool]] | None = None,
                 on_event: Callable[[Any], None] | None = None,
                 worker_alive: Callable[[str], Awaitable[bool]] | None = None,
                 kafka_quiet_s: Callable[[], float | None] | None = None) -> AsyncGenerator[bytes, None]:
    """``queue``/``first``: a live subscription made before the request was produced (no replay needed).
    ``retracted``: whether the output check retracted the reply; its text is then never replayed.
    ``on_event`` sees each event of ``first`` and the live ones just before they are sent (metrics).
    ``worker_alive``: whether the generating worker still beats (raises RedisError when Redis is down); a
    stalled stream gets one ``recovering`` event per cause (see :class:`Recovery`). ``kafka_quiet_s``: the
    seconds since Kafka last answered this gateway's tail."""
    live = queue if queue is not None else relay.subscribe(generation_id)
    seen = on_event or (lambda _event: None)
    watch = Recovery(worker_alive, kafka_quiet_s)
    OPEN_STREAMS.inc()
    beat = asyncio.create_task(keep_beating(heartbeat, beat_every_s))
    sent = _Sent(after if after is not None else -1)
    try:
        if first is not None:
            head = _caught(first, sent, watch, seen)
        else:
            hide = retracted is not None and await retracted()
            head = _replayed(relay, generation_id, after, since_ms, hide, saved, sent, watch)
        async with contextlib.aclosing(head) as frames:
            async for f in frames:
                yield f
        if sent.ended:
            return
        async with contextlib.aclosing(_live(live, sent.last, keepalive_s, watch, seen)) as frames:
            async for f in frames:
                yield f
    finally:
        OPEN_STREAMS.dec()
        beat.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await beat
        relay.unsubscribe(generation_id, live)


class _Sent:
    """How far one stream has gone before it turns live: the last offset sent, and whether it already ended."""

    def __init__(self, last: int) -> None:
        self.last, self.ended = last, False


async def _caught(first: list[tuple[int, Any]], sent: _Sent, watch: Recovery,
                  seen: Callable[[Any], None]) -> AsyncGenerator[bytes, None]:
    """The events a subscription made before the request was produced has already caught."""
    for offset, event in first:
        if not watch.saw(event):
            continue
        seen(event)
        for f in to_sse(offset, event):
            yield f
        sent.last = max(sent.last, offset)
        if is_last(event):
            sent.ended = True
            return


async def _replayed(relay: TokenRelay, generation_id: str, after: int | None, since_ms: int, hide: bool,
                    saved: Callable[[], Awaitable[list[bytes]]], sent: _Sent,
                    watch: Recovery) -> AsyncGenerator[bytes, None]:
    """The buffered events after ``after`` (token chunks left out when ``hide``: the reply was retracted); the
    saved reply when the buffer has aged past them; the end when nothing follows ``after``."""
    replayed = 0
    try:
        async for offset, event in relay.replay(generation_id, after, since_ms):
            replayed += 1
            if hide and isinstance(event, TokensAppended):
                sent.last = offset
                continue  # still in the buffer, but withdrawn: the retracted frame comes instead
            if not watch.saw(event):
                continue
            for f in to_sse(offset, event):
                yield f
            sent.last = offset
            if is_last(event):
                sent.ended = True
                return
    except Aged:
        for f in await saved():
            yield f
        sent.ended = True
        return
    if replayed == 0:
        async with contextlib.aclosing(_finished(relay, generation_id, after, since_ms, saved, sent)) as frames:
            async for f in frames:
                yield f


async def _finished(relay: TokenRelay, generation_id: str, after: int | None, since_ms: int,
                    saved: Callable[[], Awaitable[list[bytes]]], sent: _Sent) -> AsyncGenerator[bytes, None]:
    """Nothing after ``after``: at (or past) the end. A finished generation ends the stream now with its final
    state (re-sent under its own id), or the saved reply; a live one goes on."""
    final = await relay.final_event(generation_id, since_ms) if after is not None else None
    if final is not None:
        for f in to_sse(*final):
            yield f
        sent.ended = True
        return
    snapshot = await saved()
    if snapshot:  # the buffer no longer has it, but the reply is saved: serve that
        for f in snapshot:
            yield f
        sent.ended = True


class Recovery:
    """Per stream: drops what a fenced-off worker appended (older owner epoch) and chunks already sent, and
    tells the client why a reply stalls: started, then no event for ``STALL_S``, and either Kafka silent
    for ``KAFKA_QUIET_S`` or Redis unreachable from here (``store_unavailable``, naming the store), or the
    worker's beat gone for ``LOST_AFTER_S`` (``worker_lost``). While Kafka is down the worker still beats
    (its beat is in Redis) but nothing it writes can arrive, so Kafka is asked first. A beat
    missing just after Redis was unreachable is the outage's, not a death: the key expired while Redis was
    down, and the worker beats again within a second of Redis coming back."""

    def __init__(self, worker_alive: Callable[[str], Awaitable[bool]] | None,
                 kafka_quiet_s: Callable[[], float | None] | None = None) -> None:
        self.worker_alive, self.kafka_quiet_s, self.worker_id, self.said = worker_alive, kafka_quiet_s, "", ""
        self.epoch, self.next_seq = 0, 0
        self.last_event = time.monotonic()
        self.missing_since: float | None = None  # when the worker's beat was first found gone in this stall
        self.redis_down_at = float("-inf")

    def saw(self, event: object) -> bool:
        """Take note of ``event``; False when the client must not see it: an owner epoch older than one
        already seen (a fenced-off worker's late append), or a token chunk already delivered."""
        epoch = getattr(event, "epoch", 0)
        stale = 0 < epoch < self.epoch  # epoch 0 is no owner's (queue events, the scheduler's own finish)
        if stale or (isinstance(event, TokensAppended) and event.seq < self.next_seq):
            return False
        self.epoch, self.last_event, self.said, self.missing_since = max(self.epoch, epoch), time.monotonic(), "", None
        if isinstance(event, GenerationStarted):
            self.worker_id = event.worker_id
        elif isinstance(event, TokensAppended):
            self.next_seq = event.seq + 1
        return True

    async def frame(self) -> bytes | None:
        """The ``recovering`` frame, once per stall and cause."""
        if not self.worker_id or self.worker_alive is None:
            return None
        now = time.monotonic()
        if now - self.last_event < STALL_S:
            return None
        quiet = self.kafka_quiet_s() if self.kafka_quiet_s is not None else None
        if quiet is not None and quiet >= KAFKA_QUIET_S:
            return self._say("store_unavailable", "Kafka")
        try:
            alive = await self.worker_alive(self.worker_id)
        except RedisError:
            self.redis_down_at = now
            return self._say("store_unavailable", "Redis")
        if alive:
            self.missing_since = None
            return None  # a slow step, or the worker waits for a store it names in its own log
        self.missing_since = self.missing_since or now
        if now - self.missing_since < LOST_AFTER_S or now - self.redis_down_at < REDIS_GRACE_S:
            return None
        return self._say("worker_lost")

    def _say(self, reason: str, store: str = "") -> bytes | None:
        if self.said == reason + store:
            return None
        self.said = reason + store
        if reason == "worker_lost":
            return frame("recovering", {"reason": reason, "message": "The worker writing this reply stopped. "
                                        "Another one is taking over; the reply continues where it left off."})
        return frame("recovering", {"reason": reason, "store": store, "message": f"{store} is not reachable; the "
                                    "reply is paused and continues where it left off once it is back."})


async def _live(live: asyncio.Queue[tuple[int, Any]], last: int, keepalive_s: float, watch: Recovery,
                seen: Callable[[Any], None]) -> AsyncGenerator[bytes, None]:
    """Live events after ``last``; at each tick of the stream's one timer, the ``recovering`` check and,
    after ``keepalive_s`` of silence, a keep-alive. An event costs a queue put and get, no timer."""
    quiet_since = time.monotonic()
    async with contextlib.aclosing(paced(live, min(keepalive_s, CHECK_EVERY_S), every_tick=True)) as items:
        async for item in items:
            if item is None:
                notice = await watch.frame()
                if notice is not None:
                    yield notice
                if time.monotonic() - quiet_since >= keepalive_s:
                    quiet_since = time.monotonic()
                    yield KEEPALIVE
                continue
            offset, event = item
            if offset <= last:
                continue  # already sent during replay
            if not watch.saw(event):
                continue
            seen(event)
            quiet_since = time.monotonic()
            for f in to_sse(offset, event):
                yield f
            last = offset
            if is_last(event):
                return


async def keep_beating(heartbeat: Callable[[], Awaitable[None]], every_s: float) -> None:
    while True:
        with contextlib.suppress(Exception):  # a missed beat only risks a cancel after the timeout
            await heartbeat()
        await asyncio.sleep(every_s)


def saved_frames(message: Any) -> list[bytes]:
    """A finished reply from Cassandra, for a reader who comes back after the buffer expired."""
    if message is None or message.status == "generating":
        return []
    stop = STOP_REASONS.get(message.status, "end")
    return [
        frame("message_start", {"message_id": message.message_id, "generation_id": message.generation_id,
                                "model": message.model, "pool": message.pool,
                                "route_reason": message.route_reason or "default"}),
        frame("snapshot", {"text": message.content}),
        frame("message_end", {"stop_reason": stop, "model": message.model,
                              "usage": {"in": message.tokens_in, "out": message.tokens_out}}),
    ]
