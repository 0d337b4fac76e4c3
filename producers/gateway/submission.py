"""Putting one request into the pipeline and waiting for admission's decision.

Shared by the native chat routes and the OpenAI-compatible route: subscribe to the
generation's token events first (so none is missed), mark the caller as owner and
reader, produce ``MessageSubmitted`` (answered only after Kafka's ack), then wait
briefly for the first decision. A refusal raises ``Refused`` before any stream starts.

If the gateway gives up on a request it may already have put in (the produce failed or
timed out, the client left before the decision), it releases the reservation at once
(or, before admission reserved, marks it so it never will) and cancels the generation:
the user is charged nothing and gets the running slot back.
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass
from typing import Any

import msgspec
from aiokafka.errors import KafkaError

from infra.stores.accounts import User
from producers.gateway.errors import ApiError, too_large, unavailable
from producers.gateway.metrics import ReplyWatch
from producers.gateway.state import Gateway
from schemas import CancelRequested, GenerationFinished, GenerationQueued, MessageSubmitted, RequestRefused, encode
from topics.clients import send

log = logging.getLogger(__name__)
Events = list[tuple[int, Any]]
DEADLINE_GRACE_S = 1.0  # past the stages' deadline before the client hears 503: a late decision is never lost
# Kafka takes a record of at most the producer's max_request_size (aiokafka's default, 1 MiB; the broker's
# message.max.bytes is 12 bytes more). Admission's event carries the same text plus its decision, so the
# request leaves it room.
MAX_RECORD_BYTES = 1_048_576 - 16 * 1024


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
    # The pipeline must decide (queue or refuse) by the deadline; the client is answered 503 a little later,
    # so a stage that finds the request past it knows nobody waits for it and drops it, charging nothing.
    request = msgspec.structs.replace(request, deadline=time.time() + gw.settings.admission_wait_s)
    sealed = await gw.sealer.seal(request)
    check_size(sealed, user.user_id)  # before anything is claimed: no retry of this request can succeed
    queue = gw.relay.subscribe(generation_id)  # before producing: no event can be missed
    try:
        await gw.relay.attach(generation_id)  # at once: its id was minted on a partition this gateway tails
        if await gw.claim(generation_id, user.user_id, request.conversation_id) > 1 and request.made_unlisted:
            # Not the conversation's first generation (a message came through another gateway): its history
            # is read, and its row, as for any other message.
            request = msgspec.structs.replace(request, made_unlisted=False, instructions=None)
            sealed = msgspec.structs.replace(sealed, made_unlisted=False, instructions=None)
        try:
            await asyncio.wait_for(send(gw.producer, gw.topics.requests, sealed, key=user.user_id),
                                   gw.settings.kafka_send_timeout_s)
        except TimeoutError as exc:  # broker down or unreachable: fail fast (a late delivery is past its deadline)
            log.warning("generation %s not acknowledged by Kafka within %.1f s", generation_id,
                        gw.settings.kafka_send_timeout_s)
            await give_up(gw, request, "the request could not be handed to Kafka")  # it may still be there
            raise unavailable("Kafka") from exc
        except KafkaError:
            await give_up(gw, request, "the request could not be handed to Kafka")
            raise
        first = await decision(gw, queue, gw.settings.admission_wait_s + DEADLINE_GRACE_S)
    except asyncio.CancelledError:
        gw.relay.unsubscribe(generation_id, queue)
        _detach(give_up(gw, request, "the client left before the first decision"))
        raise
    except BaseException:
        gw.relay.unsubscribe(generation_id, queue)
        raise
    refused = next((e for _, e in first if isinstance(e, RequestRefused)), None)
    for _, event in first:
        watch.seen(event)
    if refused is not None:
        gw.relay.unsubscribe(generation_id, queue)
        raise Refused(refused)
    if not any(isinstance(e, (GenerationQueued, GenerationFinished)) for _, e in first):
        gw.relay.unsubscribe(generation_id, queue)
        log.warning("generation %s: no decision within %.1f s; answered 503 (the stages drop it past its "
                    "deadline)", generation_id, gw.settings.admission_wait_s)
        raise ApiError(503, "not_started", "The service could not start your reply in time; nothing was "
                                           "charged. Try again in a few seconds.", retry_after=5)
    log.info("generation %s accepted for conversation %s", generation_id, request.conversation_id,
             extra={"generation_id": generation_id, "conversation_id": request.conversation_id,
                    "user_id": user.user_id, "plan": user.plan, "pool": request.pool})
    return Accepted(generation_id, queue, first, watch)


async def submit_made(gw: Gateway, user: User, request: MessageSubmitted) -> Accepted:
    """``submit`` for a request whose conversation the gateway made for it, listed (``made_listed``): refused, or
    given up, the conversation is taken off the list again, so a call that was answered with an error leaves
    no conversation there (the take-off runs on even when the client has left)."""
    try:
        return await submit(gw, user, request)
    except BaseException:
        if request.made_listed:
            _detach(_take_off_list(gw, request))
        raise


async def _take_off_list(gw: Gateway, request: MessageSubmitted) -> None:
    try:
        await gw.conversations.take_off_list(request.user_id, request.conversation_id)
    except Exception as exc:  # noqa: BLE001 - Cassandra down: the conversation stays listed, empty, deletable
        log.warning("conversation %s: a refused call's conversation not taken off the list (%s)",
                    request.conversation_id, type(exc).__name__)


def check_size(event: MessageSubmitted, key: str) -> None:
    """413 for a request Kafka would refuse as too large (aiokafka's MessageSizeTooLargeError)."""
    size = len(encode(event)) + len(key.encode())
    if size > MAX_RECORD_BYTES:
        raise too_large(f"The request is {size:,} bytes once encoded; the limit is {MAX_RECORD_BYTES:,}. "
                        "Send a shorter history or fewer messages.")


async def decision(gw: Gateway, queue: asyncio.Queue[tuple[int, Any]], wait_s: float) -> Events:
    """Events up to and including the first decision (queued or refused), or what came within ``wait_s``."""
    got: Events = []
    deadline = time.monotonic() + wait_s
    while (left := deadline - time.monotonic()) > 0:
        try:
            item = await asyncio.wait_for(queue.get(), left)
        except TimeoutError:
            break
        got.append(item)
        if isinstance(item[1], (GenerationQueued, RequestRefused, GenerationFinished)):
            return got
    return got


async def give_up(gw: Gateway, request: MessageSubmitted, why: str) -> None:
    """Charge nothing for a request this gateway stopped following: release its reservation and slot now
    (or keep admission from reserving one), then ask any worker holding it to stop."""
    gid = request.generation_id
    if gw.quota is not None:
        with contextlib.suppress(Exception):  # Redis down too: the reaper releases it when it expires
            await gw.quota.release(gid, "gateway", user_id=request.user_id, plan=request.plan)
    with contextlib.suppress(KafkaError, TimeoutError):  # Kafka down: it was most likely never put in
        await cancel(gw, gid, request.conversation_id, request.user_id)
    log.info("generation %s given up (%s): reservation released, cancel sent", gid, why)


_detached: set[asyncio.Task[None]] = set()


def _detach(coro: Any) -> None:
    task = asyncio.ensure_future(coro)
    _detached.add(task)
    task.add_done_callback(_detached.discard)


async def cancel(gw: Gateway, generation_id: str, conversation_id: str, user_id: str) -> None:
    await send(gw.producer, gw.topics.control, CancelRequested(
        generation_id=generation_id, conversation_id=conversation_id, user_id=user_id, reason="user"),
        key=generation_id)

