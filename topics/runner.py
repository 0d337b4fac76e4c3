"""The one run/stop shape of every stage, aiokafka or faust, and running several in one process.

A stage says which clients it holds (anything with ``start``/``stop``: producers, consumers, a faust app),
what runs beside its loop (``background``) and what one turn of the loop is (``step``); ``Runner`` starts the
clients in order, loops until ``stop()``, then cancels the background work and stops the clients in reverse.
"""
from __future__ import annotations

import asyncio
import contextvars
import logging
import time
from collections.abc import Coroutine
from typing import Any

from topics.metrics import STAGE_UP

log = logging.getLogger(__name__)
# The stage this task runs; tasks it starts inherit it, so every log line logged on its behalf names it.
current_stage: contextvars.ContextVar[str] = contextvars.ContextVar("parley_stage", default="")


class Runner:
    name: str = ""

    def __init__(self) -> None:
        self._stopping = asyncio.Event()

    def clients(self) -> list[Any]:
        return []

    def background(self) -> list[Coroutine[Any, Any, None]]:
        return []

    async def step(self) -> None:
        """One turn of the loop; by default there is none: wait until stopped."""
        await self._stopping.wait()

    async def idle(self, seconds: float) -> None:
        """Sleep ``seconds``, or less when the stage is stopped meanwhile."""
        try:
            await asyncio.wait_for(self._stopping.wait(), seconds)
        except TimeoutError:
            pass

    @property
    def stopping(self) -> bool:
        return self._stopping.is_set()

    async def run(self) -> None:
        current_stage.set(self.name)
        STAGE_UP.labels(stage=self.name).set(1)
        started: list[Any] = []
        try:
            for client in self.clients():
                await client.start()
                started.append(client)
            tasks = [asyncio.create_task(c) for c in self.background()]
            log.info("stage %s running", self.name)
            loop = asyncio.create_task(self._loop())
            try:
                await _until_done_or_failed(loop, tasks)
            finally:
                for task in (loop, *tasks):
                    task.cancel()
                await asyncio.gather(loop, *tasks, return_exceptions=True)
        finally:
            STAGE_UP.labels(stage=self.name).set(0)
            for client in reversed(started):
                await client.stop()

    async def _loop(self) -> None:
        while not self._stopping.is_set():
            await self.step()

    def stop(self) -> None:
        self._stopping.set()

    def reset(self) -> None:
        """Before a restart after a failure: a stage whose clients cannot start twice makes new ones."""


async def _until_done_or_failed(loop: asyncio.Task[None], background: list[asyncio.Task[None]]) -> None:
    """Until the stage's loop returns; a loop or background task that raises raises here, so the stage
    fails whole and is restarted (a background task that died alone would leave the stage up and deaf)."""
    pending: set[asyncio.Task[None]] = {loop, *background}
    while loop in pending:
        done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
        for task in done:
            failure = None if task.cancelled() else task.exception()
            if failure is not None:
                raise failure


async def run_stages(*stages: Runner, restart_s: float = 1.0, max_restart_s: float = 30.0) -> None:
    """Run stages together until stopped. A stage that fails is restarted after a backoff, alone: one
    stage's failure never stops the others (store outages are waited out inside each stage)."""
    tasks = [asyncio.create_task(_keep_running(s, restart_s, max_restart_s), name=s.name or type(s).__name__)
             for s in stages]
    try:
        await asyncio.gather(*tasks)
    finally:
        for s in stages:
            s.stop()
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def _keep_running(stage: Runner, first_s: float, max_s: float) -> None:
    """``stage.run()`` until it returns (stopped); restarted with backoff, on fresh clients, when it raises."""
    delay, name = first_s, stage.name or type(stage).__name__
    while True:
        began = time.monotonic()
        try:
            await stage.run()
            return
        except asyncio.CancelledError:
            raise
        except Exception:  # noqa: BLE001 - logged whole; the stage restarts, the others run on
            log.exception("stage %s failed; restarting it in %.1f s (the other stages carry on)", name, delay)
        if time.monotonic() - began > 60:
            delay = first_s  # it ran a good while: a fresh failure, not a crash loop
        await asyncio.sleep(delay)
        delay = min(delay * 2, max_s)
        stage.reset()
