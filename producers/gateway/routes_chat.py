"""Sending a message (reply streams as SSE on the response), regenerating, stopping and resuming.

A POST is answered only after its ``MessageSubmitted`` is acknowledged by Kafka, so a
2xx is never lost. It then waits briefly for admission's decision: a refusal becomes a
plain HTTP error (429/503 with Retry-After) before any stream starts.
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

from fastapi import APIRouter, Depends, Header, Request
from fastapi.responses import Response, StreamingResponse
from pydantic import BaseModel, Field
from redis.exceptions import RedisError

from infra.stores import keys
from infra.stores.accounts import User
from producers.gateway import metrics, openai_compat, sampling_params, submission
from producers.gateway.auth import current_user, gateway_of
from producers.gateway.errors import ApiError, not_found, responses
from producers.gateway.state import Gateway
from producers.gateway.streaming import follow, saved_frames
from producers.gateway.text import Text
from schemas import MessageSubmitted, id_time_ms, new_id, own_client_message_id

log = logging.getLogger(__name__)
router = APIRouter(prefix="/v1", tags=["chat"], responses=responses(401, 422, 503))
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
CMID_TTL_S = 24 * 3600


class SendMessage(BaseModel):
    content: Text = Field(description="the user's message")
    model: Text | None = Field(default=None, description="model pool; default: the service's default pool")
    client_message_id: Text | None = Field(default=None, max_length=128,
                                           description="retry key: the same id attaches to the same reply; "
                                                       "reusing it with other content is a 409")
    # The OpenAI endpoint's sampling parameters (README); typed loosely so the one validator names the
    # parameter in its message.
    max_tokens: Any = None
    temperature: Any = None
    top_p: Any = None
    top_k: Any = None
    min_p: Any = None
    seed: Any = None
    stop: Any = None
    presence_penalty: Any = None
    frequency_penalty: Any = None
    repetition_penalty: Any = None
    min_tokens: Any = None
    ignore_eos: Any = None
    logprobs: Any = None
    top_logprobs: Any = None
    response_format: Any = None

    def sampled(self) -> tuple[int | None, sampling_params.Parsed]:
        """(max_tokens, sampling), or a 422 naming the parameter."""
        fields = self.model_dump(exclude={"content", "model", "client_message_id", "parent_id"}, exclude_none=True)
        try:
            max_tokens = sampling_params.reply_cap(fields, "max_tokens")
            return max_tokens, sampling_params.parse(fields, max_tokens)
        except sampling_params.CompatError as exc:
            raise ApiError(422, "invalid_parameter", exc.message) from exc
    parent_id: str | None = Field(default=None, max_length=64,
                                  description="the reply this message follows (its branch); default: the newest")


class EditMessage(BaseModel):
    content: str = Field(description="the new text of the user message")
    model: str | None = None
    client_message_id: str | None = Field(default=None, max_length=128)


class Regenerate(BaseModel):
    model: Text | None = None
    client_message_id: Text | None = Field(default=None, max_length=128)


@router.get("/models", tags=["models"])
async def models(request: Request, user: User = Depends(current_user)) -> dict[str, Any]:
    """The pools (``default``, ``items``) and the same list in OpenAI's shape (``object``, ``data``)."""
    gw = gateway_of(request)
    return {"default": gw.settings.default_pool,
            "items": [{"pool": p, "model": m} for p, m in gw.models.items()],
            "object": "list", "data": openai_compat.model_list(gw.models, gw.settings.default_pool)}


SSE_OK: dict[int | str, dict[str, Any]] = {200: {"content": {"text/event-stream": {}}}}


@router.post("/conversations/{conversation_id}/messages", response_class=StreamingResponse,
             responses=SSE_OK | responses(404, 409, 413, 429))
async def send_message(request: Request, conversation_id: str, body: SendMessage,
                       user: User = Depends(current_user)) -> Response:
    gw = gateway_of(request)
    _check_content(gw, body.content)
    pool = _pool(gw, body.model)
    max_tokens, sampled = body.sampled()
    await _own_conversation(gw, conversation_id, user)
    if body.parent_id is not None:
        history = await gw.conversations.all_messages(conversation_id)
        if not any(m.message_id == body.parent_id and m.role == "assistant" for m in history):
            raise not_found("reply to follow (parent_id)")
    return await _submit(request, gw, user, conversation_id, body.content, pool, body.client_message_id,
                         message_id=new_id(), parent_id=body.parent_id, max_tokens=max_tokens, sampled=sampled)


@router.post("/conversations/{conversation_id}/messages/{message_id}/edit", response_class=StreamingResponse,
             responses={200: {"content": {"text/event-stream": {}}}})
async def edit(request: Request, conversation_id: str, message_id: str, body: EditMessage,
               user: User = Depends(current_user)) -> Response:
    """Edit and resend: a new user message beside ``message_id`` (same turn, same parent) with a new reply."""
    gw = gateway_of(request)
    _check_content(gw, body.content)
    pool = _pool(gw, body.model)
    await _own_conversation(gw, conversation_id, user)
    history = await gw.conversations.all_messages(conversation_id)
    if not any(m.message_id == message_id and m.role == "user" for m in history):
        raise not_found("user message")
    return await _submit(request, gw, user, conversation_id, body.content, pool, body.client_message_id,
                         message_id=new_id(), parent_id=None, edit_of=message_id)


@router.post("/conversations/{conversation_id}/messages/{message_id}/regenerate",
             response_class=StreamingResponse, responses=SSE_OK | responses(404, 409, 429))
async def regenerate(request: Request, conversation_id: str, message_id: str, body: Regenerate | None = None,
                     user: User = Depends(current_user)) -> Response:
    """A new sibling reply to the same user message (``message_id`` may name the user message or a reply)."""
    gw = gateway_of(request)
    body = body or Regenerate()
    pool = _pool(gw, body.model)
    await _own_conversation(gw, conversation_id, user)
    history = await gw.conversations.all_messages(conversation_id)
    target = next((m for m in history if m.message_id == message_id), None)
    if target is None:
        raise not_found("message")
    parent = target if target.role == "user" else next((m for m in history if m.message_id == target.parent_id), None)
    if parent is None:
        raise not_found("message")
    return await _submit(request, gw, user, conversation_id, parent.content, pool, body.client_message_id,
                         message_id=parent.message_id, parent_id=parent.message_id, regenerate=True)


@router.post("/generations/{generation_id}/cancel", status_code=202, responses=responses(404))
async def cancel(request: Request, generation_id: str, user: User = Depends(current_user)) -> dict[str, str]:
    gw = gateway_of(request)
    owner = await gw.owner(generation_id)
    if owner is None or owner[0] != user.user_id:
        raise not_found("generation")
    await submission.cancel(gw, generation_id, owner[1], user.user_id)
    log.info("generation %s cancel requested by its owner", generation_id)
    return {"generation_id": generation_id, "status": "cancelling"}


@router.get("/generations/{generation_id}/stream", response_class=StreamingResponse,
            responses=SSE_OK | responses(404, 422))
async def stream(request: Request, generation_id: str, user: User = Depends(current_user),
                 last_event_id: str | None = Header(default=None)) -> Response:
    gw = gateway_of(request)
    owner = await gw.owner(generation_id)
    if owner is None or owner[0] != user.user_id:
        raise not_found("generation")
    after = _event_id(request.query_params.get("after", last_event_id))
    slot = gw.streams.take(user.user_id)  # before the resume opens a Kafka reader
    try:
        if after is not None and (after := await gw.relay.check_offset(generation_id, after)) is None:
            raise ApiError(422, "bad_last_event_id", "Last-Event-ID is an event id of another stream; "
                                                     "resume with the last id this stream sent.")
        if after is not None:
            metrics.reconnected(user.plan)
        response = _sse(gw, generation_id, owner[1], after=after, queue=None, first=None)
    except BaseException:
        slot.release()
        raise
    return slot.holding(response)


def _event_id(raw: str | None) -> int | None:
    if raw in (None, ""):
        return None
    try:
        value = int(raw)
    except ValueError as exc:
        raise ApiError(422, "bad_last_event_id", "Last-Event-ID must be an event id this stream sent.") from exc
    if value < 0:
        raise ApiError(422, "bad_last_event_id", "Last-Event-ID must be an event id this stream sent "
                                                 "(they are never negative).")
    return value


# -- helpers -----------------------------------------------------------------------------------------------
def _check_content(gw: Gateway, content: str) -> None:
    if not content.strip():
        raise ApiError(422, "empty_content", "The message is empty. Type something to send.")
    if len(content) > gw.settings.max_message_chars:
        raise ApiError(413, "too_large", f"The message is {len(content):,} characters; the limit is "
                                         f"{gw.settings.max_message_chars:,}. Shorten it or split it.")


def _pool(gw: Gateway, requested: str | None) -> str:
    pool = requested or gw.settings.default_pool
    if pool not in gw.models:
        raise ApiError(422, "unknown_model", f"Unknown model {pool!r}. Choose one of: {', '.join(gw.models)}.")
    return pool


async def _own_conversation(gw: Gateway, conversation_id: str, user: User) -> None:
    if await gw.conversation_owners.owner(conversation_id) != user.user_id:
        raise not_found("conversation")
    await gw.sealer.keys.ensure(conversation_id, user.user_id)  # the message is sealed with it


async def _submit(request: Request, gw: Gateway, user: User, conversation_id: str, content: str, pool: str,
                  client_message_id: str | None, **kwargs: Any) -> Response:
    """The reply's stream, holding one of the user's stream slots until it ends (429 when none is free)."""
    slot = gw.streams.take(user.user_id)  # before anything is put in
    try:
        response = await _submit_held(request, gw, user, conversation_id, content, pool, client_message_id,
                                      **kwargs)
    except BaseException:
        slot.release()
        raise
    return slot.holding(response)


async def _submit_held(request: Request, gw: Gateway, user: User, conversation_id: str, content: str, pool: str,
                       client_message_id: str | None, *, message_id: str, parent_id: str | None,
                       regenerate: bool = False, edit_of: str | None = None, max_tokens: int | None = None,
                       sampled: sampling_params.Parsed | None = None) -> StreamingResponse:
    generation_id = gw.new_generation_id()
    first = gw.conversation_owners.first_message(conversation_id) \
        if not regenerate and edit_of is None and parent_id is None else None
    if not client_message_id:
        # Nothing can retry under an id the client never had (the page sends none): the id is made from the
        # generation's own, so neither this gateway's Redis claim nor the prompt build's durable one (a Paxos
        # round on a new id) is asked for.
        cmid, claim_key = own_client_message_id(generation_id), ""
    else:
        cmid = f"c-{gw.sealer.digest(user.user_id, conversation_id, client_message_id)}"
        claim_key = keys.client_message(conversation_id, cmid)
        holder = await _claim(gw, claim_key, gw.sealer.digest(user.user_id, content)[:16], generation_id)
        if holder != generation_id:  # a retry: attach to the generation the first request started
            log.info("client_message_id retry attaches to generation %s", holder)
            return _sse(gw, holder, conversation_id, after=None, queue=None, first=None)
    try:
        accepted = await submission.submit(gw, user, MessageSubmitted(
            generation_id=generation_id, conversation_id=conversation_id, user_id=user.user_id,
            plan=user.plan, message_id=message_id, client_message_id=cmid, content=content, pool=pool,
            parent_id=parent_id, regenerate=regenerate, edit_of=edit_of, gateway_id=gw.gateway_id,
            max_tokens=max_tokens, temperature=sampled.temperature if sampled else None,
            sampling=sampled.sampling if sampled else None,
            made_unlisted=first is not None, instructions=first.instructions if first is not None else None))
    except Exception:  # refused, or never acknowledged: a later retry with this id must start afresh
        if claim_key:
            with contextlib.suppress(RedisError):
                await gw.redis.delete(claim_key)
        raise
    return _sse(gw, generation_id, conversation_id, after=None, queue=accepted.queue, first=accepted.first,
                on_event=accepted.watch.seen if accepted.watch else None)


async def _claim(gw: Gateway, claim_key: str, fingerprint: str, generation_id: str) -> str:
    """Claim a client's message id in Redis for ``generation_id``; the generation that holds it: this one, or for
    a retry the one the first request started. The client's id and the content are matched, never read back: the
    key and ``fingerprint`` are keyed hashes, not the text."""
    if await gw.redis.set(claim_key, f"{generation_id} {fingerprint}", nx=True, ex=CMID_TTL_S):
        return generation_id
    existing, _, was = ((await gw.redis.get(claim_key)) or b"").decode().partition(" ")
    if was and was != fingerprint:
        raise ApiError(409, "client_message_id_reused", "This client_message_id was already used for a "
                                                        "different message. Use a new id for new content.")
    if existing:
        return existing
    if not await gw.redis.set(claim_key, f"{generation_id} {fingerprint}", nx=True, ex=CMID_TTL_S):
        raise ApiError(409, "client_message_id_busy", "Another request with this client_message_id is "
                                                      "starting right now; retry in a moment.")
    return generation_id


async def _retracted(gw: Gateway, generation_id: str) -> bool:
    return bool(await gw.redis.exists(keys.generation_retracted(generation_id)))


def _sse(gw: Gateway, generation_id: str, conversation_id: str, *, after: int | None,
         queue: asyncio.Queue[tuple[int, Any]] | None, first: list[tuple[int, Any]] | None,
         on_event: Any = None) -> StreamingResponse:
    async def saved() -> list[bytes]:
        messages = await gw.finished.current(await gw.conversations.all_messages(conversation_id))
        return saved_frames(next((m for m in messages if m.generation_id == generation_id
                                  and m.role == "assistant"), None))

    body = follow(gw.relay, generation_id, after=after, since_ms=id_time_ms(generation_id) - 2000, queue=queue,
                  first=first, keepalive_s=gw.keepalive_s, beat_every_s=gw.settings.reader_timeout_s / 3,
                  heartbeat=lambda: gw.reader_beat(generation_id),
                  saved=saved, retracted=lambda: _retracted(gw, generation_id), on_event=on_event,
                  worker_alive=gw.worker_alive, kafka_quiet_s=gw.kafka_quiet_s)
    headers = dict(SSE_HEADERS, **{"X-Generation-Id": generation_id})
    return StreamingResponse(body, media_type="text/event-stream", headers=headers)
