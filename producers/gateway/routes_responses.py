"""The OpenAI Responses API over the pipeline: ``POST /v1/responses``, ``GET /v1/responses/{id}``
(``?stream=true&starting_after=N`` resumes on any gateway), ``POST .../cancel``, ``DELETE``.

A response is one generation. Its request (model, instructions, background, ...) is kept in
Redis so any gateway can answer for it; its status and text come from the generation's events in
``chat.tokens`` (replayed, then followed live) or, once those aged out, from the saved reply.
``background: true`` answers at once and the reply generates with no client attached (its reader
heartbeat is held for ``BACKGROUND_READER_S``, so the abandoned-reply detector leaves it alone).
``previous_response_id`` continues that response's conversation, with the saved history fitted to
the prompt budget as in the chat path. ``store: false``: the response cannot be fetched and its
conversation is deleted from the start.
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any

import orjson
from fastapi import APIRouter, Body, Depends, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from infra.stores import keys
from infra.stores.accounts import User
from producers.gateway import jobs as jobs_
from producers.gateway import openai_compat as compat
from producers.gateway import responses_compat as rc
from producers.gateway import responses_tools as rtools
from producers.gateway import submission
from producers.gateway.auth import current_user, gateway_of
from producers.gateway.jobs import CancelOnLeave, Job
from producers.gateway.pacing import paced
from producers.gateway.routes_chat import SSE_HEADERS
from producers.gateway.sse import BLANK_KEEPALIVE
from producers.gateway.state import OWNER_TTL_S, Gateway
from producers.gateway.streaming import keep_beating
from schemas import MessageSubmitted, Usage, id_time_ms, new_id, own_client_message_id
from schemas.gateway import ChatTurn

log = logging.getLogger(__name__)
router = APIRouter(prefix="/v1", tags=["responses"])
BACKGROUND_READER_S = 3600  # longer than any reply takes; a cancel still stops it at once
CANCEL_WAIT_S = 30.0
FINISHED = ("complete", "stopped", "length")
REPLAYED = object()  # between the replayed events and the live ones
SEALED_ECHO = ("instructions", "metadata", "tools")  # the user-written fields of the request kept in Redis


@router.post("/responses", response_model=None,
             responses={200: {"content": {"application/json": {}, "text/event-stream": {}}}})
async def create_response(request: Request, body: Any = Body(..., examples=[{"model": "large", "input": "Hi!"}]),
                          user: User = Depends(current_user)) -> Any:
    gw = gateway_of(request)
    prior = await _prior_calls(gw, user, body)
    req = rc.parse(body, gw.models, gw.settings.default_pool, gw.settings.max_message_chars, prior)
    slot = gw.streams.take(user.user_id)  # held while the reply streams or is waited for
    try:
        return slot.holding(await _create(request, gw, user, req, prior is not None))
    except BaseException:
        slot.release()
        raise


async def _create(request: Request, gw: Gateway, user: User, req: rc.ResponseRequest, called: bool) -> Response:
    """``called``: the previous response made calls, and its reply leads ``req.input``."""
    conversation_id, earlier = await _conversation(gw, user, req, called)
    echo = req.echo()
    accepted = await _submit(gw, user, req, conversation_id, earlier, echo)
    generation_id = accepted.generation_id
    job = Job(gw, accepted, conversation_id, user.user_id, jobs_.model_of(gw, accepted, req.pool),
              detached=req.background)
    if req.background:
        await gw.redis.set(keys.reader_heartbeat(generation_id), "background", ex=BACKGROUND_READER_S)
    log.info("response %s created: background %s, stream %s, store %s", generation_id, req.background, req.stream,
             req.store)
    headers = {"X-Generation-Id": generation_id, "X-Conversation-Id": conversation_id}
    if req.stream:
        return CancelOnLeave(_live(job, echo), [job], media_type="text/event-stream",
                             headers=dict(SSE_HEADERS, **headers))
    state = rc.State(generation_id, job.model)
    if req.background:
        for _, event in accepted.first:
            state.feed(event)
        job.close()
    else:
        await _wait(request, job, state)
    return JSONResponse(rc.response_object(state, echo), headers=headers)


async def _conversation(gw: Gateway, user: User, req: rc.ResponseRequest, called: bool
                        ) -> tuple[str, list[ChatTurn]]:
    """The conversation the response continues, with its earlier turns, or a new one made for it."""
    conversation_id, earlier = await _continued(gw, user, req.previous_response_id)
    if called:
        earlier = earlier[:-1]  # the previous reply is in req.input, its calls written as calls
    if conversation_id is not None:
        return conversation_id, earlier
    keep = req.store and not gw.keeps_nothing(user)  # no-retention plans: not listed, no title
    # Listed as it is made (as a chat completion's): persistence then neither reads nor lists it; a refused
    # call is taken off the list again (``submission.submit_made``).
    conv = await gw.conversations.create(user.user_id, model=req.pool, source="api", listed=keep,
                                         title=" ".join(req.input[-1].content.split())[:60] if keep else None)
    if not req.store:  # deleted from the start: no stage lists it, titles it or reads it back
        await gw.conversations.mark_deleted(conv)
    return conv.conversation_id, earlier


async def _submit(gw: Gateway, user: User, req: rc.ResponseRequest, conversation_id: str,
                  earlier: list[ChatTurn], echo: dict[str, Any]) -> submission.Accepted:
    """The response kept in Redis (when stored), then its message submitted; a refusal forgets the response."""
    system = [ChatTurn("system", req.instructions)] if req.instructions else []
    message_id = new_id()  # before the generation id: the user message sorts before its reply
    generation_id = gw.new_generation_id()  # lands on a partition this gateway tails
    if req.store:  # before producing: any gateway can answer for it from the first event on
        await gw.redis.set(keys.response(generation_id), orjson.dumps(
            {"user_id": user.user_id, "conversation_id": conversation_id, "model": gw.models[req.pool],
             "echo": await gw.sealer.seal_values(conversation_id, echo, SEALED_ECHO)}), ex=OWNER_TTL_S)
    fresh = req.previous_response_id is None
    try:
        return await submission.submit_made(gw, user, MessageSubmitted(
            generation_id=generation_id, conversation_id=conversation_id, user_id=user.user_id, plan=user.plan,
            message_id=message_id, client_message_id=own_client_message_id(generation_id),
            content=req.input[-1].content,
            pool=req.pool, max_tokens=req.max_output_tokens, temperature=req.temperature,
            history=[*system, *earlier, *req.input], gateway_id=gw.gateway_id, sampling=req.sampling,
            fresh_conversation=fresh, made_listed=fresh and req.store and not gw.keeps_nothing(user)))
    except BaseException:
        await gw.redis.delete(keys.response(generation_id))
        raise


async def _wait(request: Request, job: Job, state: rc.State) -> None:
    """Feeds ``state`` the reply's events until it is done; a client that leaves meanwhile gets a 499."""
    beat = job.reading()
    try:
        async for _, event in jobs_.merged([job], idle_s=1.0):
            if event is None:
                if await request.is_disconnected():
                    raise compat.CompatError(499, "client_closed", "The client closed the request.")
                continue
            state.feed(event)
            if state.done:
                job.finished = True
                break
    finally:
        beat.cancel()
        job.close()


@router.get("/responses/{response_id}", response_model=None,
            responses={200: {"content": {"application/json": {}, "text/event-stream": {}}}})
async def retrieve_response(request: Request, response_id: str, stream: bool = False,
                            starting_after: int | None = None, user: User = Depends(current_user)) -> Any:
    """Status and output so far; with ``stream=true``, the events after ``starting_after``, then live."""
    gw = gateway_of(request)
    gid, meta = await _meta(gw, user, response_id)
    if stream:
        slot = gw.streams.take(user.user_id)
        body = _resumed(gw, gid, meta, -1 if starting_after is None else starting_after)
        return slot.holding(StreamingResponse(body, media_type="text/event-stream", headers=dict(SSE_HEADERS)))
    state = await _state(gw, gid, meta)
    return rc.response_object(state, meta["echo"])


@router.post("/responses/{response_id}/cancel")
async def cancel_response(request: Request, response_id: str, user: User = Depends(current_user)) -> Any:
    """Stops the reply within one engine step; answers once it ended, with the text made so far."""
    gw = gateway_of(request)
    gid, meta = await _meta(gw, user, response_id)
    state = await _state(gw, gid, meta)
    if not state.done:
        await submission.cancel(gw, gid, meta["conversation_id"], user.user_id)
        log.info("response %s cancel requested by its owner", gid)
        state = rc.State(gid, state.model)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(CANCEL_WAIT_S):
                async for event in _events(gw, gid):
                    if event is not None and event is not REPLAYED:
                        state.feed(event)
                    if state.done:
                        break
    return rc.response_object(state, meta["echo"])


@router.delete("/responses/{response_id}")
async def delete_response(request: Request, response_id: str, user: User = Depends(current_user)) -> Any:
    gw = gateway_of(request)
    gid, meta = await _meta(gw, user, response_id)
    await submission.cancel(gw, gid, meta["conversation_id"], user.user_id)  # a no-op once it ended
    await gw.redis.delete(keys.response(gid))
    for m in await gw.conversations.all_messages(meta["conversation_id"]):
        if m.generation_id == gid:  # the reply and the user message it answered
            await gw.conversations.delete_message(m.conversation_id, m.turn, m.message_id)
    return {"id": response_id, "object": "response.deleted", "deleted": True}


# -- helpers -----------------------------------------------------------------------------------------------
async def _meta(gw: Gateway, user: User, response_id: str, param: str | None = None) -> tuple[str, dict[str, Any]]:
    gid = rc.generation_of(response_id)
    raw = await gw.redis.get(keys.response(gid)) if gid else None
    meta = orjson.loads(raw) if raw else None
    if gid is None or meta is None or meta["user_id"] != user.user_id:
        raise compat.CompatError(404, "not_found", f"No response found with id '{response_id}'.", param)
    meta["echo"] = await gw.sealer.open_values(meta["conversation_id"], meta["echo"], SEALED_ECHO)
    return gid, meta


async def _prior_calls(gw: Gateway, user: User, body: Any) -> list[dict[str, Any]] | None:
    """The previous response's calls as an assistant message, when it made any: the new input's
    ``function_call_output`` items answer them."""
    previous = body.get("previous_response_id") if isinstance(body, dict) else None
    if not isinstance(previous, str) or rc.generation_of(previous) is None:
        return None
    gid, meta = await _meta(gw, user, previous, "previous_response_id")
    request = rtools.request_of(meta["echo"])
    if request is None:
        return None
    message = rtools.prior_message(request, gid, (await _state(gw, gid, meta)).text)
    return [message] if message is not None else None


async def _continued(gw: Gateway, user: User, previous: str | None) -> tuple[str | None, list[ChatTurn]]:
    """The conversation a ``previous_response_id`` continues, and its turns up to that response, oldest
    first. The previous reply itself comes from the buffer when persistence has not saved it yet."""
    if previous is None:
        return None, []
    gid, meta = await _meta(gw, user, previous, "previous_response_id")
    messages = await gw.conversations.all_messages(meta["conversation_id"])
    asked = next((m for m in messages if m.generation_id == gid and m.role == "user"), None)
    state = await _state(gw, gid, meta)
    if asked is None or not state.done or state.status == "failed":
        raise compat.invalid(f"Response '{previous}' has not finished; continue from it once it has.",
                             "previous_response_id")
    users = {m.turn: m.content for m in messages if m.role == "user" and m.turn <= asked.turn}
    replies: dict[int, str] = {}
    for m in messages:  # oldest first, so the newest sibling of a turn wins
        if m.role == "assistant" and m.status in FINISHED:
            replies[m.turn] = m.content
    replies[asked.turn] = state.text
    turns: list[ChatTurn] = []
    for turn in sorted(users):
        turns += [ChatTurn("user", users[turn]), ChatTurn("assistant", replies.get(turn, ""))]
    return meta["conversation_id"], turns


async def _events(gw: Gateway, gid: str, follow: bool = True) -> AsyncIterator[Any]:
    """The generation's events from its start: replayed from the buffer, ``REPLAYED``, then live (if
    ``follow``; ``None`` after each quiet keep-alive interval)."""
    live = gw.relay.subscribe(gid) if follow else None  # before the replay: nothing falls in between
    last = -1
    try:
        async for offset, event in gw.relay.replay(gid, None, id_time_ms(gid) - 2000):
            last = offset
            yield event
        yield REPLAYED
        if live is None:
            return
        async with contextlib.aclosing(paced(live, gw.keepalive_s)) as items:
            async for item in items:
                if item is None:
                    yield None
                    continue
                offset, event = item
                if offset > last:
                    last = offset
                    yield event
    finally:
        if live is not None:
            gw.relay.unsubscribe(gid, live)


async def _state(gw: Gateway, gid: str, meta: dict[str, Any]) -> rc.State:
    state = rc.State(gid, meta["model"])
    seen = False
    async for event in _events(gw, gid, follow=False):
        if event is not REPLAYED:
            seen = True
            state.feed(event)
    if not seen:
        saved = await _saved(gw, gid, meta)
        if saved is not None:
            state.text, state.model, state.status, state.usage = saved
    return state


async def _saved(gw: Gateway, gid: str, meta: dict[str, Any]) -> tuple[str, str, str, Usage] | None:
    """The buffer no longer has it: (text, model, status, usage) of the saved reply, once persistence wrote it."""
    messages = await gw.conversations.all_messages(meta["conversation_id"])
    m = next((m for m in messages if m.message_id == gid and m.role == "assistant"), None)
    if m is None or m.status not in rc.STATUS:
        return None
    return m.content, m.model or "", rc.STATUS[m.status], Usage(
        prompt_tokens=m.tokens_in or 0, completion_tokens=m.tokens_out or 0, cached_prompt_tokens=m.tokens_cached or 0)


async def _live(job: Job, echo: dict[str, Any]) -> AsyncGenerator[bytes, None]:
    """A new response's stream, as its events arrive."""
    stream = rc.EventStream(rc.State(job.generation_id, job.model), echo)
    beat = None if job.detached else job.reading()
    try:
        for event in stream.start():
            yield rc.sse(event)
        async for _, event in jobs_.merged([job], idle_s=job.gw.keepalive_s):
            if event is None:
                yield BLANK_KEEPALIVE
                continue
            for out in stream.feed(event):
                yield rc.sse(out)
            if stream.state.done:
                job.finished = True
                break
    finally:
        if beat is not None:
            beat.cancel()
        job.close()


async def _resumed(gw: Gateway, gid: str, meta: dict[str, Any], after: int) -> AsyncGenerator[bytes, None]:
    """Events numbered after ``after``: the same numbers the first stream gave, from any gateway."""
    stream = rc.EventStream(rc.State(gid, meta["model"]), meta["echo"])
    beat = None if meta["echo"].get("background") else asyncio.create_task(
        keep_beating(lambda: gw.reader_beat(gid), gw.settings.reader_timeout_s / 3))
    replayed = 0
    try:
        for item in stream.start():
            if item["sequence_number"] > after:
                yield rc.sse(item)
        async for event in _events(gw, gid):
            if event is None:
                yield BLANK_KEEPALIVE
                continue
            out = []
            if event is REPLAYED:
                saved = None if replayed else await _saved(gw, gid, meta)
                if saved is not None:  # aged out of the buffer, but saved
                    out = stream.saved(*saved)
            else:
                replayed += 1
                out = stream.feed(event)
            for item in out:
                if item["sequence_number"] > after:
                    yield rc.sse(item)
            if stream.state.done:
                return
    finally:
        if beat is not None:
            beat.cancel()
