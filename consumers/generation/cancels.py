"""The cancels a worker has heard: every ``CancelRequested`` on ``chat.control`` (no group: a broadcast, every
partition), from the last ``CANCEL_MEMORY_S`` on, since a cancel may arrive before its request is picked up.

Each one aborts its sequence on this worker's engine before the engine's next step (the engine ignores ids it
does not run), and is remembered so that a request picked up later ends as ``stopped`` without reaching the
engine. Nothing per token.
"""
from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Any

from schemas import CancelRequested, decode
from schemas.errors import EventDecodeError
from topics.clients import STEADY_FETCH_WAIT_MS
from topics.replay import open_reader

CANCEL_MEMORY_S = 15 * 60  # a cancel may arrive before its request is picked up


class Cancels:
    def __init__(self, abort: Callable[[str], Awaitable[Any]], memory_s: float = CANCEL_MEMORY_S) -> None:
        self.abort, self.memory_s = abort, memory_s
        self.heard: dict[str, float] = {}  # generation_id -> when its cancel was heard

    def __contains__(self, generation_id: object) -> bool:
        return generation_id in self.heard

    async def follow(self, bootstrap: str, topic: str) -> None:
        """Hear the control topic until cancelled, from ``memory_s`` ago."""
        reader = await open_reader(bootstrap, topic, since_ms=int((time.time() - self.memory_s) * 1000),
                                   fetch_max_wait_ms=STEADY_FETCH_WAIT_MS)  # a cancel answers the fetch at once
        try:
            async for record in reader.consumer:
                await self.on_record(record.value)
        finally:
            await reader.close()

    async def on_record(self, value: bytes, now: float | None = None) -> None:
        try:
            event = decode(value, (CancelRequested,))
        except EventDecodeError:
            return  # the dead-letter copy is made by the control topic's producers' tests, not by every worker
        if not isinstance(event, CancelRequested):
            return
        now = time.time() if now is None else now
        self.heard[event.generation_id] = now
        await self.abort(event.generation_id)
        horizon = now - self.memory_s
        for gid in [g for g, at in self.heard.items() if at < horizon]:
            del self.heard[gid]
