"""How a worker ends a reply: the ``GenerationFinished`` it writes, and what must hold before anyone sees it.

In order: the owner checks it still holds the generation (a fenced-off worker writes nothing; the newer owner
finishes it); the user's reservation is given back (no engine read the prompt) or the user's running slot
freed (settlement charges what the engine did), so a client sending its next request the moment this one ends
finds the slot free; the reply is put where a gateway reads finished replies (sealed like the event); then the
finish goes to ``chat.tokens`` first (a recovering worker treats a finish there as final) and ``chat.replies``.
"""
from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import msgspec

from consumers.generation.appending import Appender
from consumers.generation.decisions import Finish, Limits, finished_event
from consumers.generation.fencing import Fence
from consumers.generation.metrics import WorkerMetrics
from consumers.generation.recovery import Saved
from infra.stores.crypto import KeyGone
from infra.stores.finished import FinishedReplies
from infra.stores.quota import Quota
from schemas import GenerationFinished, GenerationRequested, Usage
from topics import Topics
from topics.clients import enqueue

log = logging.getLogger(__name__)


class Finisher:
    def __init__(self, limits: Limits, worker_id: str, topics: Topics, appender: Appender, fence: Fence,
                 quota: Quota, finished: FinishedReplies, metrics: WorkerMetrics,
                 seal: Callable[[Any], Awaitable[Any]]) -> None:
        self.limits, self.worker_id, self.topics, self.appender = limits, worker_id, topics, appender
        self.fence, self.quota, self.finished, self.metrics, self.seal = fence, quota, finished, metrics, seal

    async def deleted(self, req: GenerationRequested) -> None:
        """The conversation was deleted: the reply ends now as ``stopped``, with nothing in it (nothing is left to
        seal it with)."""
        log.info("generation %s stopped: its conversation was deleted", req.generation_id)
        await self.finish(finished_event(req, self.limits, self.worker_id, "stopped", "", Usage(), -1,
                                         "conversation deleted"))

    async def early(self, req: GenerationRequested, decision: Finish, saved: Saved) -> None:
        """A request that ends without the engine: cancelled before it ran, refused, or finished by an earlier
        owner that lost it before committing."""
        if saved.finished is not None:
            # The previous owner finished but lost the request before committing: announce the same finish again
            # on the replies topic (its readers skip duplicates); chat.tokens already has it. Under this owner's
            # epoch: taking the generation over fenced the old one's, and settlement and persistence ignore a
            # finish from a fenced owner, so the reply would stay 'generating' with its tokens reserved.
            again = msgspec.structs.replace(saved.finished, epoch=self.fence.epoch(req.generation_id))
            await self._send(self.topics.replies, again, req.conversation_id)
            return
        if decision.status == "failed":
            self.metrics.failures.inc()
            log.warning("generation %s refused: %s", req.generation_id, decision.reason)
        # A request that never reached the engine read no prompt: only a reply a previous worker started has one.
        usage = Usage(prompt_tokens=len(req.prompt_token_ids) if saved.started else 0,
                      completion_tokens=len(saved.token_ids))
        await self.finish(finished_event(req, self.limits, self.worker_id, decision.status, saved.text, usage,
                                         saved.next_seq - 1, decision.reason))

    async def finish(self, event: GenerationFinished) -> None:
        if await self.fence.fenced(event.generation_id):
            return  # the newer owner finishes it
        event = msgspec.structs.replace(event, epoch=self.fence.epoch(event.generation_id))
        if event.purpose == "reply" and event.status == "failed" and not (event.usage.prompt_tokens
                                                                         or event.usage.completion_tokens):
            await self.quota.release(event.generation_id, "worker")  # no engine read it: costs nothing
        elif event.purpose == "reply":  # failed in the engine too: settlement charges what the engine did
            # Before anyone sees its end: a client that sends the next request once this one ends must find
            # the slot free (an OpenAI client asking n=2 twice in a row was refused 429 while settlement lagged).
            await self.quota.free_slot(event.user_id, event.generation_id)
        try:
            event = await self.seal(event)
        except KeyGone:  # deleted meanwhile: the finish carries no text, neither the reply's nor the question's
            event = msgspec.structs.replace(event, text="", question="")
        # The user message rides to persistence on chat.replies alone: no reader of chat.tokens or Redis needs it.
        public = msgspec.structs.replace(event, question="") if event.question else event
        if event.purpose == "reply":
            await self.finished.put(public)  # readable (sealed like the event) before anyone sees its end
        # chat.tokens first: a recovering worker treats a finish there as final.
        await self._send(self.topics.tokens, public, event.generation_id)
        await self._send(self.topics.replies, event, event.conversation_id)
        if event.status == "failed":
            self.metrics.failures.inc()
        self.metrics.replies.labels(pool=self.limits.pool, status=event.status).inc()
        usage = event.usage
        log.info("generation %s %s: %d prompt / %d completion tokens, %d cached", event.generation_id,
                 event.status, usage.prompt_tokens, usage.completion_tokens, usage.cached_prompt_tokens, extra={
                     "generation_id": event.generation_id, "conversation_id": event.conversation_id,
                     "user_id": event.user_id, "pool": self.limits.pool, "status": event.status,
                     "worker_id": self.worker_id, "prompt_tokens": usage.prompt_tokens,
                     "completion_tokens": usage.completion_tokens, "cached_prompt_tokens": usage.cached_prompt_tokens})

    async def _send(self, topic: str, event: Any, key: str) -> None:
        """Handed to the producer and acknowledged (the generation's own appends before it, in order)."""
        sent: asyncio.Future[Any] = await enqueue(self.appender.producer, topic, event, key=key)
        await self.appender.landed(event.generation_id, [sent])
