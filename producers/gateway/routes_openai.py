"""``POST /v1/chat/completions``: the OpenAI Chat Completions API over the same pipeline.

Each call makes a conversation owned by the caller and submits a ``MessageSubmitted``
carrying the whole client history, so quotas, queueing, routing and cancel apply as
for the native API. ``stream=false`` waits for ``GenerationFinished`` and answers one
``chat.completion``; ``stream=true`` relays token events as ``chat.completion.chunk``
SSE lines. A client that leaves before the end cancels the generation.
Translation and error shapes are in ``openai_compat``.
"""
from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from aiokafka.errors import KafkaError
from fastapi import APIRouter, Body, Depends, Request
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel
from starlette.types import Receive, Scope, Send

from infra.stores.accounts import User
from producers.gateway import openai_compat as compat
from producers.gateway import submission
from producers.gateway.auth import current_user, gateway_of
from producers.gateway.routes_chat import SSE_HEADERS
from producers.gateway.sse import KEEPALIVE
from producers.gateway.state import Gateway
from producers.gateway.streaming import keep_beating
from producers.gateway.submission import Accepted
from schemas import (
    GenerationFinished,
    GenerationQueued,
    GenerationStarted,
    MessageSubmitted,
    RequestRefused,
    TokensAppended,
    new_id,
)

log = logging.getLogger(__name__)


class OpenAIErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class OpenAIError(BaseModel):
    """OpenAI's error shape, so its clients raise their own exceptions."""

    error: OpenAIErrorDetail


ERRORS: dict[int | str, dict[str, Any]] = {
    s: {"model": OpenAIError, "description": why} for s, why in {
        400: "invalid or unsupported parameter", 401: "invalid_api_key", 404: "model_not_found",
        422: "text that is not valid Unicode", 429: "rate_limit_exceeded or insufficient_quota",
        500: "the model failed", 503: "overloaded or backend_unavailable"}.items()}
router = APIRouter(prefix="/v1", tags=["openai"], responses=ERRORS)
_detached: set[asyncio.Task[None]] = set()
EXAMPLE = {"model": "large", "messages": [{"role": "user", "content": "What is the capital of France?"}],
           "stream": False, "max_tokens": 64}


@router.post("/chat/completions", response_model=None,
             responses={200: {"content": {"application/json": {}, "text/event-stream": {}}}})
async def chat_completions(request: Request, body: Any = Body(..., examples=[EXAMPLE]),
                           user: User = Depends(current_user)) -> Any:
    """OpenAI-compatible chat completion; see the README for what is not supported (a 400 names it)."""
    gw = gateway_of(request)
    chat = compat.parse(body, gw.models, gw.settings.default_pool, gw.settings.max_message_chars)
    conv = await gw.conversations.create(user.user_id, model=chat.pool, title=chat.title)
    message_id = new_id()  # before the generation id: the user message sorts before its reply
    generation_id = new_id()
    accepted = await submission.submit(gw, user, MessageSubmitted(
        generation_id=generation_id, conversation_id=conv.conversation_id, user_id=user.user_id,
        plan=user.plan, message_id=message_id, client_message_id=f"openai-{generation_id}",  # type: ignore[arg-type]
        content=chat.content, pool=chat.pool, max_tokens=chat.max_tokens, temperature=chat.temperature,
        history=chat.history, gateway_id=gw.gateway_id))
    job = _Job(gw, accepted, conv.conversation_id, user.user_id, _model_of(gw, accepted, chat.pool))
    headers = {"X-Generation-Id": generation_id, "X-Conversation-Id": conv.conversation_id}
    if chat.stream:
        return _CancelOnLeave(_chunks(job, chat.include_usage), job, media_type="text/event-stream",
                              headers=dict(SSE_HEADERS, **headers))
    return JSONResponse(await _completion(request, job), headers=headers)


@dataclass
class _Job:
    """One accepted generation this request reads; ``finished`` once its last event was seen."""

    gw: Gateway
    accepted: Accepted
    conversation_id: str
    user_id: str
    model: str
    finished: bool = False

    @property
    def generation_id(self) -> str:
        return self.accepted.generation_id

    async def events(self, idle_s: float) -> AsyncIterator[Any]:
        """The generation's events; ``None`` after ``idle_s`` without one (time to check on the client)."""
        for _, event in self.accepted.first:
            yield event
        while True:
            try:
                _, event = await asyncio.wait_for(self.accepted.queue.get(), idle_s)
            except TimeoutError:
                yield None
                continue
            yield event

    def reading(self) -> asyncio.Task[None]:
        gid, every_s = self.generation_id, self.gw.settings.reader_timeout_s / 3
        return asyncio.create_task(keep_beating(lambda: self.gw.reader_beat(gid), every_s))

    def close(self) -> None:
        """Stop following; a generation the client left before its end is cancelled."""
        self.gw.relay.unsubscribe(self.generation_id, self.accepted.queue)
        if not self.finished:
            self.finished = True
            _detach(self._cancel())

    async def _cancel(self) -> None:
        try:
            await submission.cancel(self.gw, self.generation_id, self.conversation_id, self.user_id)
            log.info("generation %s cancelled: its OpenAI-API client left", self.generation_id)
        except KafkaError as exc:  # no reader heartbeat either: the abandoned-reply detector stops it
            log.warning("generation %s cancel not sent: %s", self.generation_id, type(exc).__name__)


async def _completion(request: Request, job: _Job) -> dict[str, Any]:
    beat = job.reading()
    try:
        async for event in job.events(idle_s=1.0):
            if event is None:
                if await request.is_disconnected():
                    break
            elif isinstance(event, RequestRefused):
                job.finished = True
                raise submission.Refused(event)
            elif isinstance(event, GenerationFinished):
                job.finished = True
                if event.status == "failed":
                    raise compat.CompatError(500, "generation_failed", event.reason or "The model failed to "
                                             "answer. Try again.", type_="server_error")
                return compat.completion(event)
        raise compat.CompatError(499, "client_closed", "The client closed the request.")
    finally:
        beat.cancel()
        job.close()


async def _chunks(job: _Job, include_usage: bool) -> AsyncGenerator[bytes, None]:
    gid, beat, sent = job.generation_id, job.reading(), ""
    try:
        yield compat.chunk(gid, job.model, {"role": "assistant", "content": ""}, include_usage=include_usage)
        async for event in job.events(idle_s=job.gw.keepalive_s):
            if event is None:
                yield KEEPALIVE
            elif isinstance(event, (GenerationQueued, GenerationStarted)):
                job.model = event.model
            elif isinstance(event, TokensAppended) and event.text:
                sent += event.text
                yield compat.chunk(gid, job.model, {"content": event.text}, include_usage=include_usage)
            elif isinstance(event, RequestRefused):
                job.finished = True
                yield compat.sse_data(compat.error_json(submission.Refused(event))[1])
                return
            elif isinstance(event, GenerationFinished):
                job.finished = True
                for line in _ending(event, sent, include_usage):
                    yield line
                return
    finally:
        beat.cancel()  # not awaited: this may run inside a cancelled scope (the client left)
        job.close()


def _ending(event: GenerationFinished, sent: str, include_usage: bool) -> list[bytes]:
    """The last lines; text the deltas did not carry (a prepared reply has none) goes first."""
    if event.status == "failed":
        message = event.reason or "The model failed to answer. Try again."
        return [compat.sse_data(compat.error_json(compat.CompatError(
            500, "generation_failed", message, type_="server_error"))[1])]
    rest = event.text[len(sent):] if event.text.startswith(sent) else ""
    gid, lines = event.generation_id, []
    if rest:
        lines.append(compat.chunk(gid, event.model, {"content": rest}, include_usage=include_usage))
    lines.append(compat.chunk(gid, event.model, {}, compat.FINISH_REASONS[event.status],
                              include_usage=include_usage))
    if include_usage:
        lines.append(compat.chunk(gid, event.model, None, usage=event.usage, include_usage=True))
    return [*lines, compat.DONE]


class _CancelOnLeave(StreamingResponse):
    """A stream that, however it ends, closes its job: a client gone before the last event cancels it.

    Starlette stops iterating the body when the client disconnects; the generator may then be
    parked at a ``yield`` and never resumed, so the cancel cannot rely on its ``finally``.
    """

    def __init__(self, body: AsyncIterator[bytes], job: _Job, **kwargs: Any) -> None:
        super().__init__(body, **kwargs)
        self.job = job

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.job.close()
            aclose: Callable[[], Awaitable[None]] | None = getattr(self.body_iterator, "aclose", None)
            if aclose is not None:
                await aclose()  # stops the generator's heartbeat if it was parked at a yield


def _model_of(gw: Gateway, accepted: Accepted, pool: str) -> str:
    """The served model name: the scheduler's choice if it already answered, else the requested pool's."""
    queued = next((e for _, e in accepted.first if isinstance(e, GenerationQueued)), None)
    return queued.model if queued is not None else gw.models[pool]


def _detach(coro: Awaitable[None]) -> None:
    task = asyncio.ensure_future(coro)
    _detached.add(task)
    task.add_done_callback(_detached.discard)
