"""Export: one conversation (the branch on screen) as JSON or Markdown, or every conversation of an account
as one streamed document: JSON (every message and sibling) or Markdown (each conversation's branch on screen, to
read). Owner only; the text is unsealed here and nowhere else on the way out.

The account export holds one conversation in memory at a time (its messages read 500 rows per page) and
at most ``MAX_CONVERSATIONS`` of them; a gateway runs one account export per user at a time.
"""
from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any, Literal

from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import Response, StreamingResponse

from infra.stores.accounts import User
from infra.stores.conversations import Conversation, Message
from infra.stores.preferences import shown
from producers.gateway import transcript
from producers.gateway.auth import current_user, gateway_of
from producers.gateway.errors import ApiError, not_found, responses
from producers.gateway.state import Gateway

log = logging.getLogger(__name__)
router = APIRouter(prefix="/v1", tags=["export"], responses=responses(401, 422, 503))

PAGE_ROWS = 500
MAX_CONVERSATIONS = 5_000
_running: set[str] = set()  # users with an account export streaming from this gateway


async def history(gw: Gateway, conversation_id: str) -> list[Message]:
    """Every message and sibling, oldest first, read a page at a time; an ended reply shown final (the copy of
    the custom instructions is the prompt's, not a message)."""
    items: list[Message] = []
    cursor: str | None = None
    while True:
        page, cursor = await gw.conversations.messages(conversation_id, cursor, PAGE_ROWS)
        items += page
        if not cursor:
            return await gw.finished.current(shown(items))


async def owned(gw: Gateway, conversation_id: str, user: User) -> Conversation:
    conv = await gw.conversations.get(conversation_id)
    if conv is None or conv.user_id != user.user_id:
        raise not_found("conversation")
    return conv


def _document(conv: Conversation, messages: list[Message], exported_at: datetime | None = None) -> dict[str, Any]:
    doc: dict[str, Any] = {"conversation_id": conv.conversation_id, "title": conv.title, "model": conv.model,
                           "source": conv.source, "updated_at": transcript.iso(conv.updated_at)}
    if exported_at is not None:
        doc["exported_at"] = transcript.iso(exported_at)
    doc["messages"] = [transcript.message_json(m) for m in messages]
    return doc


def _attachment(name: str) -> dict[str, str]:
    return {"Content-Disposition": f'attachment; filename="{name}"', "Cache-Control": "no-store"}


@router.get("/conversations/export", responses=responses(429))
async def export_all(request: Request,
                     format: Literal["json", "markdown"] = Query("json", description="json or markdown"),
                     user: User = Depends(current_user)) -> StreamingResponse:
    """Every conversation of the caller (listed or not), streamed a conversation at a time: as JSON, each with
    every message and sibling (``parent_id`` rebuilds the tree); as Markdown, each one's branch on screen (the
    newest sibling at every turn), oldest conversation first, to read."""
    gw = gateway_of(request)
    if user.user_id in _running:
        raise ApiError(429, "export_running", "An export of your conversations is already running. "
                                              "Wait for it to finish, then try again.", retry_after=5)
    ids = (await gw.conversations.ids_of_user(user.user_id))[:MAX_CONVERSATIONS]
    if format == "markdown":
        return StreamingResponse(_stream_all(gw, user.user_id, ids, _MarkdownAll()),
                                 media_type="text/markdown; charset=utf-8",
                                 headers=_attachment("parley-conversations.md"))
    return StreamingResponse(_stream_all(gw, user.user_id, ids, _JsonAll()), media_type="application/json",
                             headers=_attachment("parley-conversations.json"))


class _JsonAll:
    """One JSON document: ``{"exported_at", "conversations": [...]}``."""

    def start(self, now: datetime) -> bytes:
        return json.dumps({"exported_at": transcript.iso(now)})[:-1].encode() + b', "conversations": ['

    def one(self, conv: Conversation, messages: list[Message], index: int, now: datetime) -> bytes:
        return (b", " if index else b"") + json.dumps(_document(conv, messages), ensure_ascii=False).encode()

    def end(self) -> bytes:
        return b"]}\n"


class _MarkdownAll:
    """Each conversation as its own export reads, separated by a rule."""

    def start(self, now: datetime) -> bytes:
        return b""

    def one(self, conv: Conversation, messages: list[Message], index: int, now: datetime) -> bytes:
        body = transcript.markdown(conv.title, conv.model, transcript.branch(messages), now)
        return (("\n---\n\n" if index else "") + body).encode()

    def end(self) -> bytes:
        return b""


async def _stream_all(gw: Gateway, user_id: str, ids: list[str], shape: _JsonAll | _MarkdownAll
                      ) -> AsyncIterator[bytes]:
    _running.add(user_id)  # here, not in the route: a response never started must not hold the slot
    try:
        now = datetime.now(UTC)
        yield shape.start(now)
        count = 0
        for conversation_id in ids:
            conv = await gw.conversations.get(conversation_id)
            if conv is None or conv.user_id != user_id:
                continue  # deleted since the list was read
            yield shape.one(conv, await history(gw, conversation_id), count, now)
            count += 1
        yield shape.end()
        log.info("account export for %s: %d conversations", user_id, count)
    finally:
        _running.discard(user_id)


@router.get("/conversations/{conversation_id}/export", responses=responses(404))
async def export_one(request: Request, conversation_id: str,
                     format: Literal["json", "markdown"] = Query("json", description="json or markdown"),
                     message_id: str | None = Query(None, max_length=64, description="the last message of the "
                                                    "branch to export (the one on screen); default: the newest"),
                     user: User = Depends(current_user)) -> Response:
    """The branch on screen, with roles, timestamps, model and status, as a file to save."""
    gw = gateway_of(request)
    conv = await owned(gw, conversation_id, user)
    messages = transcript.branch(await history(gw, conversation_id), message_id)
    if message_id is not None and not messages:
        raise not_found("message")
    now = datetime.now(UTC)
    if format == "markdown":
        body = transcript.markdown(conv.title, conv.model, messages, now)
        return Response(body, media_type="text/markdown; charset=utf-8",
                        headers=_attachment(transcript.filename(conv.title, "md")))
    return Response(json.dumps(_document(conv, messages, now), ensure_ascii=False), media_type="application/json",
                    headers=_attachment(transcript.filename(conv.title, "json")))
