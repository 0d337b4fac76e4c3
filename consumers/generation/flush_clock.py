"""The flush window kept on time, whatever the engine's step: one task per worker makes a record of each
reply's gathered tokens once its window has passed.

A reply's outputs come one engine step apart. Flushed only when an output arrives, a record waits for the
first output after its window (up to a step past it), and a step that also prefills arriving prompts (140 ms
for 1,000 tokens at the seeds' rate) holds the tokens made before it until it ends: a paid client's gap was
the window plus the longest step. Here a tick every tenth of the window (10 ms at most) flushes the replies
whose window will have passed by the next tick, so a gap is at most the window, or the step when the step
is longer. A reply whose output check holds its text back (a sentence at a time) is not followed: its records
wait for the check anyway.

Cost: one timer a tick for the worker, and a look at each followed reply; no task or timer per reply.
"""
from __future__ import annotations

import asyncio
import logging
import time
from typing import Protocol

from consumers.generation.coalescing import FlushPolicy

log = logging.getLogger(__name__)


class OnTime(Protocol):
    async def flush_on_time(self, now: float, ahead_s: float) -> None: ...


class FlushClock:
    def __init__(self, policy: FlushPolicy) -> None:
        self.tick_s = policy.tick_s
        self.runs: set[OnTime] = set()

    @property
    def ticking(self) -> bool:
        """A record per output, or flushed at outputs only: no clock."""
        return self.tick_s > 0

    def follow(self, run: OnTime) -> None:
        if self.ticking:
            self.runs.add(run)

    def drop(self, run: OnTime) -> None:
        self.runs.discard(run)

    async def tick(self) -> None:
        """Flush every followed reply whose window will have passed by the next tick (up to a tick early, never
        late); each reply keeps its own records in order."""
        now = time.time()
        for run in list(self.runs):
            try:
                await run.flush_on_time(now, self.tick_s)
            except Exception:  # noqa: BLE001 - a reply keeps its own failure; this is a bug, not an outage
                log.exception("flush on time failed")
                self.runs.discard(run)

    async def run(self) -> None:
        if not self.ticking:
            return
        while True:
            await asyncio.sleep(self.tick_s)
            if self.runs:
                await self.tick()
