"""The flush window kept on time, whatever the engine's step: one task per worker makes records of its
replies' gathered tokens.

A reply's outputs come one engine step apart. Flushed only when an output arrives, a record waits for the
first output after its window (up to a step past it), and a step that also prefills arriving prompts (140 ms
for 1,000 tokens at the seeds' rate) holds the tokens made before it until it ends: a paid client's gap was
the window plus the longest step. The clock flushes while the engine is still on its step, in one of two ways:

- Together (shipped): each reply joins one of ``flush_groups`` groups (two) as it starts, and a tick every
  window / groups flushes one group whole, in the order its replies joined. A reply's records are a window
  apart, and the worker hands Kafka one burst a tick for its share of its replies: one produce request, and
  one fetch for each reader, where a reply each on its own window made about a hundred a second. A tick costs
  the worker and each gateway more than the records in it (aiokafka's protocol code is Python): two groups
  cost them about a quarter less CPU per token than four at the seeds' load, with the same client gaps; one
  group of all, in one burst a window, stretched the paid p99 a little further. A reply that had nothing
  gathered at its group's tick (a step longer than the window) is flushed by its next output.
- Each on its own: a tick every tenth of the window (10 ms at most) flushes the replies whose window will have
  passed by the next tick.

A reply whose output check holds its text back (a sentence at a time) is not flushed by the clock: its records
wait for the check anyway. Cost: one timer a tick for the worker, and a look at each followed reply of the
tick's group; no task or timer per reply.

Drained at the tick (``drain_at_tick``, shipped with the groups): a reply's loop does not take each engine
output as it comes, which woke its task once per engine step for every running reply (a third of the worker's
CPU at the seeds' load was the event loop's wake-ups). It waits on its ``Gate`` instead, which opens at its
group's tick, or at once when the engine has finished the request; meanwhile the engine joins the request's
outputs into one (vLLM's collector merges unread delta outputs). So each reply's loop runs once a window:
counting, the output check's text and the record for all the steps of that window at once, made by the loop as
it takes them; the clock only opens the gates. Held-back replies are gated too (their sentence is checked at the
tick after it completes, at most a window later).
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
        self.together = policy.together and self.ticking  # replies flushed in groups, each a window apart
        self.groups = policy.groups if self.together else 1
        self.ahead_s = policy.window_s if self.together else self.tick_s  # a group's tick takes all it gathered
        # Each followed reply's group, in the order they were followed, so a reply keeps its place in its
        # group's burst of records and its gaps stay a window long (a set's order changes as it grows).
        self.runs: dict[OnTime, int] = {}
        self.drains = policy.drain_at_tick and self.together  # each reply's loop wakes at its group's tick
        self._waiting: dict[OnTime, asyncio.Future[None]] = {}  # gated replies waiting for their tick
        self._group_ticks = [0] * self.groups  # how many times each group has ticked
        self._ticks = 0
        self._next_group = 0
        self._last_ticks = [0.0] * self.groups  # when each group was last flushed (its records' ``now``)

    @property
    def ticking(self) -> bool:
        """A record per output, or flushed at outputs only: no clock."""
        return self.tick_s > 0

    def follow(self, run: OnTime) -> None:
        if self.ticking:
            self.runs[run] = self._next_group
            self._next_group = (self._next_group + 1) % self.groups

    def drop(self, run: OnTime) -> None:
        self.runs.pop(run, None)
        self.wake(run)

    def gate(self, run: OnTime) -> Gate:
        """A gate for a followed reply's loop (``drains``)."""
        return Gate(self, run)

    def ticks_of(self, run: OnTime) -> int:
        group = self.runs.get(run)
        return -1 if group is None else self._group_ticks[group]

    def wake(self, run: OnTime) -> bool:
        """Wake ``run``'s loop if it waits for its tick; False if it was not waiting."""
        waiter = self._waiting.pop(run, None)
        if waiter is None:
            return False
        if not waiter.done():
            waiter.set_result(None)
        return True

    async def until_tick(self, run: OnTime) -> None:
        if run not in self.runs:
            return  # not followed (ended, or no clock): nothing to wait for
        waiter = self._waiting[run] = asyncio.get_running_loop().create_future()
        try:
            await waiter
        finally:
            if self._waiting.get(run) is waiter:
                del self._waiting[run]

    def last_tick_of(self, run: OnTime) -> float:
        """When the clock last flushed ``run``'s group; 0 for a reply it does not follow."""
        group = self.runs.get(run)
        return 0.0 if group is None else self._last_ticks[group]

    async def tick(self) -> None:
        """Flush the followed replies of this tick's group (together), or every followed reply whose window will
        have passed by the next tick (up to a tick early, never late); each reply keeps its records in order. Drained:
        open the gates of this tick's group."""
        group = self._ticks % self.groups
        self._ticks += 1
        self._group_ticks[group] += 1
        now = self._last_ticks[group] = time.time()
        for run, of in list(self.runs.items()):
            if of != group:
                continue
            if not self.drains:  # drained, each reply's loop makes its own record as it takes its tokens
                try:
                    await run.flush_on_time(now, self.ahead_s)
                except Exception:  # noqa: BLE001 - a reply keeps its own failure; this is a bug, not an outage
                    log.exception("flush on time failed")
                    self.runs.pop(run, None)
            self.wake(run)

    async def run(self) -> None:
        if not self.ticking:
            return
        loop = asyncio.get_running_loop()
        next_at = loop.time()
        while True:  # ticks a tick apart however long each takes (one that overran is not made up for)
            next_at = max(next_at + self.tick_s, loop.time())
            await asyncio.sleep(next_at - loop.time())
            if self.runs:
                await self.tick()


class Gate:
    """Where a reply's loop waits between engine outputs when the clock drains (``engine.Gate``): until its
    group's next tick, unless the group ticked while the loop was busy (then at once), or until the engine wakes
    it at a finish."""

    __slots__ = ("clock", "run", "seen", "woken")

    def __init__(self, clock: FlushClock, run: OnTime) -> None:
        self.clock, self.run = clock, run
        self.seen: int | None = None  # the group's ticks when the loop last passed; None before its first output
        self.woken = False  # the engine finished the request while the loop was busy

    async def wait(self) -> None:
        ticks = self.clock.ticks_of(self.run)
        # After the first output (sent at once), the next tick: the ticks while the prompt waited and prefilled
        # do not count, or the second record would follow the first by a step, not by up to a window.
        if (ticks == self.seen or self.seen is None) and not self.woken:
            await self.clock.until_tick(self.run)
            ticks = self.clock.ticks_of(self.run)
        self.seen, self.woken = ticks, False

    def wake(self) -> None:
        if not self.clock.wake(self.run):
            self.woken = True
