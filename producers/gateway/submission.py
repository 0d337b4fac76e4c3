"""Putting one request into the pipeline and waiting for admission's decision.

Shared by the native chat routes and the OpenAI-compatible route: subscribe to the
generation's token events first (so none is missed), mark the caller as owner and
reader, produce ``MessageSubmitted`` (answered only after Kafka's ack), then wait
briefly for the first decision. A refusal raises ``Refused`` before any stream starts.
"""
from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import Any

from infra.stores.accounts import User
from producers.gateway.errors import ApiError
from producers.gateway.metrics import ReplyWatch
from producers.gateway.state import Gateway
from schemas import CancelRequested, GenerationQueued, MessageSubmitted, RequestRefused
from topics.clients import send

log = logging.getLogger(__name__)
Events = list[tuple[int, Any]]


class Refused(ApiError):
    """Admission, prompt build or the scheduler said no: a plain HTTP error (429/503 with Retry-After)."""

    def __init__(self, event: RequestRefused) -> None:
        super().__init__(event.status, event.reason, event.message, event.retry_after_s)
        self.event = event


@dataclass
class Accepted:
    generation_id: str
    queue: asyncio.Queue[tuple[int, Any]]  # the live subscription; the caller unsubscribes it
    first: Events  # events up to the first decision, already taken off ``queue``
    watch: ReplyWatch | None = None  # what the user experiences: TTFT, tokens/s, how it ended


async def submit(gw: Gateway, user: User, request: MessageSubmitted) -> Accepted:
    generation_id = request.generation_id
    watch = ReplyWatch(user.plan, request.pool or gw.settings.default_pool)  # accepted now: TTFT counts from here
    queue = gw.relay.subscribe(generation_id)  # before producing: no event can be missed
    try:
        await gw.claim(generation_id, user.user_id, request.conversation_id)
        await send(gw.producer, gw.topics.requests, await gw.sealer.seal(request), key=user.user_id)
        first = await decision(gw, queue)
    except BaseException:
        gw.relay.unsubscribe(generation_id, queue)
        raise
    refused = next((e for _, e in first if isinstance(e, RequestRefused)), None)
    for _, event in first:
        watch.seen(event)
    if refused is not None:
        gw.relay.unsubscribe(generation_id, queue)
        raise Refused(refused)
    log.info("generation %s accepted for conversation %s", generation_id, request.conversation_id,
             extra={"generation_id": generation_id, "conversation_id": request.conversation_id,
                    "user_id": user.user_id, "plan": user.plan, "pool": request.pool})
    return Accepted(generation_id, queue, first, watch)


async def decision(gw: Gateway, queue: asyncio.Queue[tuple[int, Any]]) -> Events:
    """Events up to and including the first decision (queued or refused), or [] after the wait limit."""
    got: Events = []
    deadline = time.monotonic() + gw.settings.admission_wait_s
    while (left := deadline - time.monotonic()) > 0:
        try:
            item = await asyncio.wait_for(queue.get(), left)
        except TimeoutError:
            break
        got.append(item)
        if isinstance(item[1], (GenerationQueued, RequestRefused)):
            return got
    return got


async def cancel(gw: Gateway, generation_id: str, conversation_id: str, user_id: str) -> None:
    await send(gw.producer, gw.topics.control, CancelRequested(
        generation_id=generation_id, conversation_id=conversation_id, user_id=user_id, reason="user"),
        key=generation_id)

