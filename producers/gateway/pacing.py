"""One timer per stream, not one per event: how a stream notices silence without paying for it per event.

A stream reads its events from an ``asyncio.Queue`` that the relay fills. Waiting on it with
``asyncio.wait_for`` (so the stream can send a keep-alive or look for a lost worker when nothing comes) costs a
task and a timer handle for every event; at 100 records a second a stream spends more on those than on the event.
Instead each stream starts one ticker that puts ``TICK`` in its own queue every ``every_s``; the stream then
waits on ``queue.get()`` alone, and an event costs a put and a get.
"""
from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator
from typing import Any

TICK: Any = object()  # put only by a stream's own ticker; the relay never puts it


async def _tick(queue: asyncio.Queue[Any], every_s: float) -> None:
    while True:
        await asyncio.sleep(every_s)
        queue.put_nowait(TICK)


async def paced(queue: asyncio.Queue[Any], every_s: float, *, every_tick: bool = False) -> AsyncGenerator[Any, None]:
    """Each item of ``queue`` as it comes, and ``None`` for silence: after each tick interval in which no item
    came (so after ``every_s`` to ``2 * every_s`` of silence), or at every tick when ``every_tick``."""
    ticker = asyncio.create_task(_tick(queue, every_s), name="stream-ticker")
    quiet = True
    try:
        while True:
            item = await queue.get()
            if item is not TICK:
                quiet = False
                yield item
            elif quiet or every_tick:
                yield None
            else:
                quiet = True
    finally:
        ticker.cancel()
