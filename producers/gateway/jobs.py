"""One accepted generation an OpenAI-API request reads (a chat choice or a response), and the
stream response that cancels it when the client leaves before its end.

Shared by ``routes_openai`` (n choices = n jobs) and ``routes_responses``.
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from aiokafka.errors import KafkaError
from fastapi.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from producers.gateway import submission
from producers.gateway.pacing import paced
from producers.gateway.state import Gateway
from producers.gateway.streaming import keep_beating
from producers.gateway.submission import Accepted
from schemas import GenerationFinished, GenerationQueued, RequestRefused

log = logging.getLogger(__name__)
_detached: set[asyncio.Task[None]] = set()


@dataclass
class Job:
    """``finished`` once its last event was seen; ``detached`` jobs (background responses) are never
    cancelled by the client leaving."""

    gw: Gateway
    accepted: Accepted
    conversation_id: str
    user_id: str
    model: str
    index: int = 0
    finished: bool = False
    detached: bool = False

    @property
    def generation_id(self) -> str:
        return self.accepted.generation_id

    async def events(self, idle_s: float) -> AsyncIterator[Any]:
        """The generation's events; ``None`` after ``idle_s`` without one (time to check on the client)."""
        for _, event in self.accepted.first:
            yield event
        async with contextlib.aclosing(paced(self.accepted.queue, idle_s)) as items:
            async for item in items:
                if item is None:
                    yield None
                    continue
                _, event = item
                if self.accepted.watch is not None:
                    self.accepted.watch.seen(event)  # TTFT, tokens/s and how it ended, as for the native routes
                yield event

    def reading(self) -> asyncio.Task[None]:
        gid, every_s = self.generation_id, self.gw.settings.reader_timeout_s / 3
        return asyncio.create_task(keep_beating(lambda: self.gw.reader_beat(gid), every_s))

    def close(self) -> None:
        """Stop following; a generation the client left before its end is cancelled."""
        self.gw.relay.unsubscribe(self.generation_id, self.accepted.queue)
        if not self.finished and not self.detached:
            self.finished = True
            detach(self._cancel())

    async def _cancel(self) -> None:
        try:
            await submission.cancel(self.gw, self.generation_id, self.conversation_id, self.user_id)
            log.info("generation %s cancelled: its OpenAI-API client left", self.generation_id)
        except KafkaError as exc:  # no reader heartbeat either: the abandoned-reply detector stops it
            log.warning("generation %s cancel not sent: %s", self.generation_id, type(exc).__name__)


async def merged(jobs: list[Job], idle_s: float) -> AsyncIterator[tuple[Job, Any]]:
    """Every job's events as they come, tagged with their job; ``(None, None)`` when all were quiet for
    ``idle_s``. Ends when each job has seen its last event."""
    if len(jobs) == 1:  # the common case, without the pump tasks
        async for event in jobs[0].events(idle_s):
            yield jobs[0], event
        return
    out: asyncio.Queue[tuple[Job, Any]] = asyncio.Queue()

    async def pump(job: Job) -> None:
        async for event in job.events(idle_s):
            if event is not None:
                await out.put((job, event))

    pumps = [asyncio.create_task(pump(j)) for j in jobs]
    try:
        async with contextlib.aclosing(paced(out, idle_s)) as items:
            async for item in items:
                yield (None, None) if item is None else item  # type: ignore[misc]
    finally:
        for p in pumps:
            p.cancel()


def is_last(event: Any) -> bool:
    return isinstance(event, (GenerationFinished, RequestRefused))


class CancelOnLeave(StreamingResponse):
    """A stream that, however it ends, closes its jobs: a client gone before the last event cancels them.

    Starlette stops iterating the body when the client disconnects; the generator may then be
    parked at a ``yield`` and never resumed, so the cancel cannot rely on its ``finally``.
    """

    def __init__(self, body: AsyncIterator[bytes], jobs: list[Job], **kwargs: Any) -> None:
        super().__init__(body, **kwargs)
        self.jobs = jobs

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            for job in self.jobs:
                job.close()
            aclose: Callable[[], Awaitable[None]] | None = getattr(self.body_iterator, "aclose", None)
            if aclose is not None:
                await aclose()  # stops the generator's heartbeat if it was parked at a yield


def model_of(gw: Gateway, accepted: Accepted, pool: str) -> str:
    """The served model name: the scheduler's choice if it already answered, else the requested pool's."""
    queued = next((e for _, e in accepted.first if isinstance(e, GenerationQueued)), None)
    return queued.model if queued is not None else gw.models[pool]


def detach(coro: Awaitable[None]) -> None:
    task = asyncio.ensure_future(coro)
    _detached.add(task)
    task.add_done_callback(_detached.discard)
