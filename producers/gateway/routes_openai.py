"""``POST /v1/chat/completions`` and ``GET /v1/models/{id}``: the OpenAI API over the same pipeline.

Each call makes a conversation owned by the caller (marked ``source=api``, so it stays out of
the page's sidebar) per choice, and submits a ``MessageSubmitted`` carrying the whole client
history and sampling parameters, so quotas, queueing, routing and cancel apply as for the
native API. ``n`` choices are ``n`` generations (seeded requests give choice i the seed + i).
``stream=false`` waits for every ``GenerationFinished`` and answers one ``chat.completion``;
``stream=true`` relays token events as ``chat.completion.chunk`` SSE lines with each choice's
``index``. A client that leaves before the end cancels the generations.
Translation and error shapes are in ``openai_compat``.
"""
from __future__ import annotations

import logging
from collections.abc import AsyncGenerator
from typing import Any

from fastapi import APIRouter, Body, Depends, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel

from infra.config.pools import PoolConfigError, load_pools
from infra.config.settings import Settings
from infra.stores.accounts import User
from producers.gateway import jobs as jobs_
from producers.gateway import openai_compat as compat
from producers.gateway import ratelimit, sampling_params, submission, tools
from producers.gateway import tool_calls as calls
from producers.gateway.auth import current_user, gateway_of
from producers.gateway.jobs import CancelOnLeave, Job
from producers.gateway.routes_chat import SSE_HEADERS
from producers.gateway.sse import BLANK_KEEPALIVE
from producers.gateway.state import Gateway
from schemas import (
    GenerationFinished,
    GenerationQueued,
    GenerationStarted,
    MessageSubmitted,
    RequestRefused,
    TokensAppended,
    new_id,
    own_client_message_id,
)
from schemas.sampling import TokenLogprob

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
EXAMPLE = {"model": "large", "messages": [{"role": "user", "content": "What is the capital of France?"}],
           "stream": False, "max_tokens": 64, "temperature": 0.7, "top_p": 0.9, "stop": ["\n\n"], "seed": 1}


@router.get("/models/{model_id:path}", tags=["models"])
async def retrieve_model(request: Request, model_id: str, user: User = Depends(current_user)) -> dict[str, Any]:
    gw = gateway_of(request)
    found = compat.model_object(model_id, gw.models, gw.settings.default_pool)
    modes = tool_modes(gw.settings).get(found.get("pool", found["id"]))
    return {**found, "tool_choice": list(modes)} if modes is not None else found


def tool_modes(settings: Settings) -> dict[str, tuple[str, ...]]:
    """Each pool's ``tool_choice`` modes, as pools.toml declares them (read once per file and overrides)."""
    key = (str(settings.pools_file), settings.pool_overrides)
    if key not in _TOOL_MODES:
        try:
            _TOOL_MODES[key] = {name: pool.tool_choices for name, pool in load_pools(settings).items()}
        except PoolConfigError:  # no pools file here: every pool answers as a vLLM pool without a parser
            _TOOL_MODES[key] = {}
    return _TOOL_MODES[key]


_TOOL_MODES: dict[tuple[str, tuple[tuple[str, str], ...]], dict[str, tuple[str, ...]]] = {}


def check_tools(settings: Settings, pool: str, request: tools.ToolRequest | None) -> None:
    """400 when the pool cannot honour the request's ``tool_choice`` (it says which pools can)."""
    if request is None:
        return
    modes = tool_modes(settings)
    have = modes.get(pool, ("none", "required", "named"))
    if request.choice in have:
        return
    able = [p for p, m in modes.items() if request.choice in m]
    why = ("it declares no tool parser: its model was not set up to decide on its own when to call a function"
           if request.choice == "auto" else "it has no structured outputs (a simulated engine)")
    instead = f" Pools that can: {', '.join(able)}." if able else ""
    also = " Or ask for tool_choice 'required' or a named function." if request.choice == "auto" and \
        "required" in have else ""
    raise compat.invalid(f"The model pool '{pool}' cannot honour tool_choice '{request.choice}': {why}.{instead}"
                         f"{also}", "tool_choice", "unsupported_tool_choice")


@router.post("/chat/completions", response_model=None,
             responses={200: {"content": {"application/json": {}, "text/event-stream": {}}}})
async def chat_completions(request: Request, body: Any = Body(..., examples=[EXAMPLE]),
                           user: User = Depends(current_user)) -> Any:
    """OpenAI-compatible chat completion; see the README for what is not supported (a 400 names it)."""
    gw = gateway_of(request)
    chat = compat.parse(body, gw.models, gw.settings.default_pool, gw.settings.max_message_chars)
    check_tools(gw.settings, chat.pool, chat.tools)
    check_n(gw, user, chat.n)
    slot = gw.streams.take(user.user_id)  # held while the reply streams or is waited for
    try:
        limits = await ratelimit.headers(gw.quota, user.user_id, user.plan)
        jobs = await submit_choices(gw, user, chat)
        headers = {"X-Generation-Id": jobs[0].generation_id, "X-Conversation-Id": jobs[0].conversation_id,
                   **limits}
        if chat.stream:
            return slot.holding(CancelOnLeave(_chunks(jobs, chat.include_usage, chat.tools), jobs,
                                              media_type="text/event-stream", headers=dict(SSE_HEADERS, **headers)))
        return JSONResponse(await _completion(request, jobs, chat.tools), headers=headers)
    except BaseException:
        slot.release()
        raise
    finally:
        if not chat.stream:
            slot.release()


def check_n(gw: Gateway, user: User, n: int) -> None:
    plans = getattr(gw.quota, "plans", None) or {}
    plan = plans.get(user.plan)
    if plan is not None and n > plan.max_running:
        raise compat.invalid(f"'n' is {n}, but the {user.plan} plan runs at most {plan.max_running} replies at "
                             f"once; each choice is one reply.", "n")


async def submit_choices(gw: Gateway, user: User, chat: compat.ChatRequest) -> list[Job]:
    jobs: list[Job] = []
    try:
        for index in range(chat.n):
            keep = not gw.keeps_nothing(user)  # no-retention: not listed, no title
            # Listed as it is made, in the same wait as its row: persistence then neither reads nor lists it. A
            # refused call is taken off the list again, and so is one whose reply has no text.
            conv = await gw.conversations.create(user.user_id, model=chat.pool, title=chat.title if keep else None,
                                                 source="api", listed=keep)
            message_id = new_id()  # before the generation id: the user message sorts before its reply
            generation_id = gw.new_generation_id()  # lands on a partition this gateway tails
            accepted = await submission.submit_made(gw, user, MessageSubmitted(
                generation_id=generation_id, conversation_id=conv.conversation_id, user_id=user.user_id,
                plan=user.plan, message_id=message_id, client_message_id=own_client_message_id(generation_id),
                content=chat.content, pool=chat.pool, max_tokens=chat.max_tokens, temperature=chat.temperature,
                history=chat.history, gateway_id=gw.gateway_id,
                sampling=sampling_params.for_choice(chat.sampling, index), fresh_conversation=True,
                made_listed=keep))
            jobs.append(Job(gw, accepted, conv.conversation_id, user.user_id,
                            jobs_.model_of(gw, accepted, chat.pool), index))
    except BaseException:
        for job in jobs:  # a later choice was refused: the earlier ones are not wanted alone
            job.close()
        raise
    return jobs


async def _completion(request: Request, jobs: list[Job], tool_request: tools.ToolRequest | None = None
                      ) -> dict[str, Any]:
    beats = [job.reading() for job in jobs]
    done: dict[int, GenerationFinished] = {}
    logprobs: dict[int, list[TokenLogprob]] = {}
    try:
        async for job, event in jobs_.merged(jobs, idle_s=1.0):
            if event is None:
                if await request.is_disconnected():
                    break
            elif isinstance(event, TokensAppended) and isinstance(event.logprobs, list):  # opened by the relay
                logprobs.setdefault(job.index, []).extend(event.logprobs)
            elif isinstance(event, RequestRefused):
                job.finished = True
                raise submission.Refused(event)
            elif isinstance(event, GenerationFinished):
                job.finished = True
                if event.status == "failed":
                    raise compat.CompatError(500, "generation_failed", event.reason or "The model failed to "
                                             "answer. Try again.", type_="server_error")
                done[job.index] = event
                if len(done) == len(jobs):
                    return compat.completion([done[i] for i in range(len(jobs))],
                                             [logprobs.get(i) if logprobs else None for i in range(len(jobs))],
                                             tool_request)
        raise compat.CompatError(499, "client_closed", "The client closed the request.")
    finally:
        for beat in beats:
            beat.cancel()
        for job in jobs:
            job.close()


async def _chunks(jobs: list[Job], include_usage: bool, tool_request: tools.ToolRequest | None = None
                  ) -> AsyncGenerator[bytes, None]:
    beats = [job.reading() for job in jobs]
    choices = _Choices(jobs, include_usage, tool_request)
    try:
        async for job, event in jobs_.merged(jobs, idle_s=jobs[0].gw.keepalive_s):
            if event is None:
                yield BLANK_KEEPALIVE
            elif isinstance(event, (GenerationQueued, GenerationStarted)):
                job.model = event.model
            elif isinstance(event, TokensAppended) and event.text:
                for line in choices.tokens(job, event):
                    yield line
            elif isinstance(event, RequestRefused):
                job.finished = True
                yield compat.sse_data(compat.error_json(submission.Refused(event))[1])
                return
            elif isinstance(event, GenerationFinished):
                job.finished = True
                lines, over = choices.finished(job, event)
                for line in lines:
                    yield line
                if over:
                    return
    finally:
        for beat in beats:
            beat.cancel()  # not awaited: this may run inside a cancelled scope (the client left)
        for job in jobs:
            job.close()


class _Choices:
    """The chunk lines of one streamed call's choices: what each has sent, its call reader, and their usage."""

    def __init__(self, jobs: list[Job], include_usage: bool, tool_request: tools.ToolRequest | None) -> None:
        self.gid, self.count = jobs[0].generation_id, len(jobs)
        self.include_usage, self.tool_request = include_usage, tool_request
        self.sent = {job.index: "" for job in jobs}
        self.readers = {job.index: calls.reader(tool_request, job.generation_id) for job in jobs} \
            if tool_request else {}
        self.usages: dict[int, Any] = {}
        self.opened: set[int] = set()

    def role(self, job: Job) -> bytes:
        """A choice's first chunk (its role), sent with its first token as vLLM's server and OpenAI do, not on
        acceptance: a client timing the first chunk (vLLM's own benchmark does) then measures the first token."""
        if job.index in self.opened:
            return b""
        self.opened.add(job.index)
        return compat.chunk(self.gid, job.model, {"role": "assistant", "content": ""},
                            include_usage=self.include_usage, index=job.index)

    def tokens(self, job: Job, event: TokensAppended) -> list[bytes]:
        """A token chunk's lines: the role first if it opens the choice, then the text or the call deltas."""
        self.sent[job.index] += event.text
        lines = [self.role(job)] if job.index not in self.opened else []
        if self.tool_request is not None:
            reader = self.readers[job.index]
            return lines + _tool_chunks(self.gid, job.model, self.tool_request, reader, reader.feed(event.text),
                                        self.include_usage, job.index)
        return [*lines, compat.chunk(self.gid, job.model, {"content": event.text}, include_usage=self.include_usage,
                                     index=job.index,
                                     logprobs=event.logprobs if isinstance(event.logprobs, list) else None)]

    def finished(self, job: Job, event: GenerationFinished) -> tuple[list[bytes], bool]:
        """A choice's last lines, and whether the stream is over: it failed, or every choice has finished (then
        the total usage when asked for, and ``[DONE]``)."""
        if event.status == "failed":
            return [_failed(event)], True
        ending = _tool_ending(self.gid, job.index, event, self.sent[job.index], self.include_usage,
                              self.tool_request, self.readers[job.index]) \
            if self.tool_request is not None and event.status != "blocked" \
            else _ending(self.gid, job.index, event, self.sent[job.index], self.include_usage)
        lines = [line for line in [self.role(job), *ending] if line]
        self.usages[job.index] = event.usage
        if len(self.usages) < self.count:
            return lines, False
        if self.include_usage:
            lines.append(compat.chunk(self.gid, event.model, None, usage=compat.total_usage(list(self.usages.values())),
                                      include_usage=True))
        return [*lines, compat.DONE], True


def _failed(event: GenerationFinished) -> bytes:
    message = event.reason or "The model failed to answer. Try again."
    return compat.sse_data(compat.error_json(compat.CompatError(
        500, "generation_failed", message, type_="server_error"))[1])


def _ending(gid: str, index: int, event: GenerationFinished, sent: str, include_usage: bool) -> list[bytes]:
    """A choice's last lines; text the deltas did not carry (a prepared reply has none) goes first."""
    rest = event.text[len(sent):] if event.text.startswith(sent) else ""
    lines = []
    if rest:
        lines.append(compat.chunk(gid, event.model, {"content": rest}, include_usage=include_usage, index=index))
    lines.append(compat.chunk(gid, event.model, {}, compat.FINISH_REASONS[event.status],
                              include_usage=include_usage, index=index))
    return lines


def _tool_chunks(gid: str, model: str, tool_request: tools.ToolRequest, reader: calls.Reader,
                 deltas: list[calls.Delta], include_usage: bool, index: int) -> list[bytes]:
    shown = [calls.delta_json(tool_request, reader, d) for d in deltas]
    return [compat.chunk(gid, model, delta, include_usage=include_usage, index=index) for delta in shown if delta]


def _tool_ending(gid: str, index: int, event: GenerationFinished, sent: str, include_usage: bool,
                 tool_request: tools.ToolRequest, reader: calls.Reader) -> list[bytes]:
    """A choice read for calls: what the deltas did not carry, what the reader held back, then the finish
    (``tool_calls`` when it called a function)."""
    rest = event.text[len(sent):] if event.text.startswith(sent) else ""
    deltas = (reader.feed(rest) if rest else []) + reader.close()
    lines = _tool_chunks(gid, event.model, tool_request, reader, deltas, include_usage, index)
    reason = calls.finish_reason(tool_request, reader, compat.FINISH_REASONS[event.status])
    return [*lines, compat.chunk(gid, event.model, {}, reason, include_usage=include_usage, index=index)]
