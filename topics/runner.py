"""The one run/stop shape of every stage, aiokafka or faust, and running several in one process.

A stage says which clients it holds (anything with ``start``/``stop``: producers, consumers, a faust app),
what runs beside its loop (``background``) and what one turn of the loop is (``step``); ``Runner`` starts the
clients in order, loops until ``stop()``, then cancels the background work and stops the clients in reverse.
"""
from __future__ import annotations

import asyncio
import contextvars
import logging
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
            try:
                while not self._stopping.is_set():
                    await self.step()
            finally:
                for task in tasks:
                    task.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
        finally:
            STAGE_UP.labels(stage=self.name).set(0)
            for client in reversed(started):
                await client.stop()

    def stop(self) -> None:
        self._stopping.set()


async def run_stages(*stages: Runner) -> None:
    """Run stages together until one fails; the others are then stopped too."""
    tasks = [asyncio.create_task(s.run(), name=s.name or type(s).__name__) for s in stages]
    try:
        done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
        for task in done:
            task.result()
    finally:
        for s in stages:
            s.stop()
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
