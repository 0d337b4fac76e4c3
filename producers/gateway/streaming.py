"""One client's SSE stream of one generation: replay after an offset, then live, then the end.

Generation never waits for a client: this only reads. While it streams it keeps the
generation's reader heartbeat alive in Redis; when it stops (the client left), the
heartbeat lapses and the abandoned-reply detector cancels the reply after the timeout.
"""
from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from redis.exceptions import RedisError

from producers.gateway.metrics import OPEN_STREAMS
from producers.gateway.pacing import paced
from producers.gateway.relay import Aged, TokenRelay
from producers.gateway.sse import KEEPALIVE, STOP_REASONS, frame, is_last, to_sse
from schemas import GenerationStarted, TokensAppended

STALL_S = 3.0  # no event this long while generating, and the worker's beat is gone: say so
CHECK_EVERY_S = 1.0


async def follow(relay: TokenRelay, generation_id: str, *, after: int | None, since_ms: int,
                 queue: asyncio.Queue[tuple[int, Any]] | None, first: list[tuple[int, Any]] | None,
                 keepalive_s: float, beat_every_s: float, heartbeat: Callable[[], Awaitable[None]],
                 saved: Callable[[], Awaitable[list[bytes]]],
                 retracted: Callable[[], Awaitable[bool]] | None = None,
                 on_event: Callable[[Any], None] | None = None,
                 worker_alive: Callable[[str], Awaitable[bool]] | None = None) -> AsyncIterator[bytes]:
    """``queue``/``first``: a live subscription made before the request was produced (no replay needed).
    ``retracted``: whether the output check retracted the reply; its text is then never replayed.
    ``on_event`` sees each event of ``first`` and the live ones just before they are sent (metrics).
    ``worker_alive``: whether a worker still beats; while the generating one does not, a stalled stream
    gets one ``recovering`` event (then the reply continues from another worker)."""
    live = queue if queue is not None else relay.subscribe(generation_id)
    seen = on_event or (lambda _event: None)
    watch = Recovery(worker_alive)
    OPEN_STREAMS.inc()
    beat = asyncio.create_task(keep_beating(heartbeat, beat_every_s))
    last = after if after is not None else -1
    try:
        if first is not None:
            for offset, event in first:
                if not watch.saw(event):
                    continue
                seen(event)
                for f in to_sse(offset, event):
                    yield f
                last = max(last, offset)
                if is_last(event):
                    return
        else:
            replayed = 0
            hide = retracted is not None and await retracted()
            try:
                async for offset, event in relay.replay(generation_id, after, since_ms):
                    replayed += 1
                    if hide and isinstance(event, TokensAppended):
                        last = offset
                        continue  # still in the buffer, but withdrawn: the retracted frame comes instead
                    if not watch.saw(event):
                        continue
                    for f in to_sse(offset, event):
                        yield f
                    last = offset
                    if is_last(event):
                        return
            except Aged:
                for f in await saved():
                    yield f
                return
            if replayed == 0:
                # Nothing after ``after``: at (or past) the end. A finished generation ends the stream now
                # with its final state (re-sent under its own id), or the saved reply; a live one goes on.
                final = await relay.final_event(generation_id, since_ms) if after is not None else None
                if final is not None:
                    for f in to_sse(*final):
                        yield f
                    return
                snapshot = await saved()
                if snapshot:  # the buffer no longer has it, but the reply is saved: serve that
                    for f in snapshot:
                        yield f
                    return
        async with contextlib.aclosing(_live(live, last, keepalive_s, watch, seen)) as frames:
            async for f in frames:
                yield f
    finally:
        OPEN_STREAMS.dec()
        beat.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await beat
        relay.unsubscribe(generation_id, live)


class Recovery:
    """Per stream: drops what a fenced-off worker appended (older owner epoch) and chunks already sent, and
    notices a dead worker: started, then no event for ``STALL_S`` and no worker beat."""

    def __init__(self, worker_alive: Callable[[str], Awaitable[bool]] | None) -> None:
        self.worker_alive, self.worker_id, self.said = worker_alive, "", False
        self.epoch, self.next_seq = 0, 0
        self.last_event = time.monotonic()

    def saw(self, event: object) -> bool:
        """Take note of ``event``; False when the client must not see it: an owner epoch older than one
        already seen (a fenced-off worker's late append), or a token chunk already delivered."""
        epoch = getattr(event, "epoch", 0)
        stale = 0 < epoch < self.epoch  # epoch 0 is no owner's (queue events, the scheduler's own finish)
        if stale or (isinstance(event, TokensAppended) and event.seq < self.next_seq):
            return False
        self.epoch, self.last_event, self.said = max(self.epoch, epoch), time.monotonic(), False
        if isinstance(event, GenerationStarted):
            self.worker_id = event.worker_id
        elif isinstance(event, TokensAppended):
            self.next_seq = event.seq + 1
        return True

    async def frame(self) -> bytes | None:
        """The ``recovering`` frame, once per stall, when the generating worker is gone."""
        if self.said or not self.worker_id or self.worker_alive is None:
            return None
        if time.monotonic() - self.last_event < STALL_S:
            return None
        try:
            alive = await self.worker_alive(self.worker_id)
        except RedisError:
            return None  # cannot tell: say nothing rather than alarm
        if alive:
            return None
        self.said = True
        return frame("recovering", {"reason": "worker_lost", "message": "The worker writing this reply stopped. "
                                    "Another one is taking over; the reply continues where it left off."})


async def _live(live: asyncio.Queue[tuple[int, Any]], last: int, keepalive_s: float, watch: Recovery,
                seen: Callable[[Any], None]) -> AsyncIterator[bytes]:
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
                                "model": message.model, "pool": message.pool}),
        frame("snapshot", {"text": message.content}),
        frame("message_end", {"stop_reason": stop, "model": message.model,
                              "usage": {"in": message.tokens_in, "out": message.tokens_out}}),
    ]
