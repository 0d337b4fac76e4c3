"""Conversations and their history: create, list newest first, read every message and sibling,
rename, delete one, delete all of an account's."""
from __future__ import annotations

import unicodedata
from typing import Any

from fastapi import APIRouter, Depends, Query, Request, Response
from pydantic import BaseModel, Field

from infra.stores.accounts import User
from infra.stores.conversations import SOURCES, Conversation, Message, mark_changed
from infra.stores.preferences import instructions_message, shown
from infra.stores.search import TITLE
from producers.gateway import deletion
from producers.gateway.auth import current_user, gateway_of
from producers.gateway.errors import ApiError, not_found, responses
from producers.gateway.text import Text
from producers.gateway.transcript import iso

router = APIRouter(prefix="/v1", tags=["conversations"], responses=responses(401, 422, 503))


def clean_title(raw: str) -> str:
    """One line of plain text, 1 to 200 characters, spaces and line breaks folded to one space; a 422 naming
    the reason otherwise. The same rule on create and on rename."""
    title = " ".join(raw.split())
    if not title:
        raise ApiError(422, "empty_title", "The title is empty. Type a name for the conversation.")
    if len(title) > 200:
        raise ApiError(422, "title_too_long", f"The title is {len(title)} characters; the limit is 200.")
    if any(unicodedata.category(ch) == "Cc" for ch in title):  # NUL, bell, escape: what folding leaves
        raise ApiError(422, "bad_title", "The title has control characters; use plain text.")
    return title


class NewConversation(BaseModel):
    title: Text | None = Field(default=None, description="1 to 200 characters, one line (as on rename)")
    model: Text | None = None


@router.post("/conversations", status_code=201)
async def create_conversation(request: Request, body: NewConversation | None = None,
                              user: User = Depends(current_user)) -> dict[str, Any]:
    gw = gateway_of(request)
    if body and body.model and body.model not in gw.models:
        raise ApiError(422, "unknown_model", f"Unknown model {body.model!r}. Choose one of: {', '.join(gw.models)}.")
    keep = not gw.keeps_nothing(user)  # a no-retention plan's conversations are neither listed nor titled
    title = clean_title(body.title) if body and body.title is not None and keep else None
    # An untitled conversation enters the list with its first reply: a send refused before any reply
    # leaves no "New conversation" behind. One the client named is listed at once.
    heard = gw.conversation_owners.keys.heard
    conv = await gw.conversations.create(user.user_id, model=body.model if body else None, title=title,
                                         listed=keep and title is not None)
    gw.conversation_owners.made(conv.conversation_id, user.user_id, heard)  # its first message reads no owner
    if keep:  # the account's custom instructions, copied into the conversation for its prompts (preferences.py)
        told = (await gw.preferences.get(user.user_id)).instructions
        if told:
            await gw.conversations.save_message(instructions_message(conv.conversation_id, told, conv.updated_at))
        if title is None and not (body and body.model):  # its first message here reads nothing of it
            gw.conversation_owners.made_unlisted(conv.conversation_id, told or None)
    if conv.title:
        await gw.search.index(user.user_id, conv.conversation_id, TITLE, -1, conv.title)
    return {"conversation_id": conv.conversation_id}


class Rename(BaseModel):
    title: Text = Field(description="the new title: 1 to 200 characters, one line")


@router.patch("/conversations/{conversation_id}", responses=responses(404))
async def rename_conversation(request: Request, conversation_id: str, body: Rename,
                              user: User = Depends(current_user)) -> dict[str, Any]:
    gw = gateway_of(request)
    title = clean_title(body.title)
    conv = await _owned(gw, conversation_id, user)
    if gw.keeps_nothing(user):
        raise ApiError(422, "no_retention", "Your plan keeps no conversations, so they have no titles.")
    await gw.conversations.rename(conv, title)
    await mark_changed(gw.redis, conversation_id)  # persistence, which keeps the rows it wrote, reads it again
    return {"conversation_id": conversation_id, "title": title}


@router.delete("/conversations/{conversation_id}", status_code=204, responses=responses(404))
async def delete_conversation(request: Request, conversation_id: str,
                              user: User = Depends(current_user)) -> Response:
    """Hidden at once everywhere, replies still generating are stopped, and its text can no longer be read
    anywhere (its data key is destroyed); the rest is purged in the background. Deleting again is a no-op."""
    gw = gateway_of(request)
    conv = await gw.conversations.get(conversation_id)
    if conv is not None and conv.user_id == user.user_id:
        await deletion.delete(gw, conv)
    elif conv is not None or not await _was_owners(gw, conversation_id, user):
        raise not_found("conversation")
    return Response(status_code=204)


@router.delete("/account/conversations", status_code=200)
async def delete_all(request: Request, user: User = Depends(current_user)) -> dict[str, int]:
    """Every conversation of the caller, as if deleted one by one: listed or not (API ones, ones whose only
    send was refused)."""
    gw = gateway_of(request)
    count = 0
    for conversation_id in await gw.conversations.ids_of_user(user.user_id):
        conv = await gw.conversations.get(conversation_id)
        if conv is None or conv.user_id != user.user_id:
            continue  # deleted already (its purge pending)
        await deletion.delete(gw, conv, reason="account")
        count += 1
    return {"deleted": count}


@router.get("/conversations", responses=responses(400))
async def list_conversations(request: Request, cursor: str | None = None, limit: int = Query(20, ge=1, le=100),
                             source: str = Query("page", description="page (the sidebar), api (made by the "
                                                 "OpenAI-compatible endpoints) or all"),
                             user: User = Depends(current_user)) -> dict[str, Any]:
    if source not in (*SOURCES, "all"):
        raise ApiError(422, "bad_source", f"source must be one of {', '.join(SOURCES)}, all; got {source!r}.")
    gw, scope = gateway_of(request), f"conversations:{user.user_id}:{source}"
    items, inner = await gw.conversations.list_for_user(user.user_id, gw.cursors.open(scope, cursor), limit,
                                                        source=None if source == "all" else source)
    next_cursor = gw.cursors.sign(scope, inner)
    return {"items": [{"conversation_id": c.conversation_id, "title": c.title, "model": c.model,
                       "updated_at": iso(c.updated_at), "source": c.source} for c in items],
            "next_cursor": next_cursor}


@router.get("/conversations/{conversation_id}/messages", responses=responses(400, 404))
async def list_messages(request: Request, conversation_id: str, cursor: str | None = None,
                        limit: int = Query(100, ge=1, le=500), user: User = Depends(current_user)) -> dict[str, Any]:
    gw = gateway_of(request)
    scope = f"messages:{conversation_id}"
    inner = gw.cursors.open(scope, cursor)  # before any store sees it, ownership checked or not
    conv = await _owned(gw, conversation_id, user)
    items, inner = await gw.conversations.messages(conversation_id, inner, limit)
    next_cursor = gw.cursors.sign(scope, inner)
    items = await gw.finished.current(shown(items))  # a reply whose end was streamed shows final, saved or not
    return {"conversation_id": conversation_id, "title": conv.title, "model": conv.model,
            "items": [message_json(m) for m in items], "next_cursor": next_cursor}


async def _owned(gw: Any, conversation_id: str, user: User) -> Conversation:
    conv = await gw.conversations.get(conversation_id)
    if conv is None or conv.user_id != user.user_id:
        raise not_found("conversation")
    return conv


async def _was_owners(gw: Any, conversation_id: str, user: User) -> bool:
    """A repeated delete is a success for the owner (idempotent), and a 404 for anyone else."""
    for table in ("conversations", "deleted_conversations"):  # marked deleted, or purged already
        rows = await gw.conversations.db.execute(
            f"SELECT user_id FROM {table} WHERE conversation_id = ?", (conversation_id,))
        if rows:
            return bool(rows[0].user_id == user.user_id)
    return False


def message_json(m: Message) -> dict[str, Any]:
    return {"message_id": m.message_id, "turn": m.turn, "role": m.role, "content": m.content, "status": m.status,
            "parent_id": m.parent_id, "generation_id": m.generation_id, "model": m.model, "pool": m.pool,
            "route_reason": m.route_reason, "usage": {"in": m.tokens_in or 0, "out": m.tokens_out or 0,
                                                      "cached": m.tokens_cached or 0},
            "created_at": iso(m.created_at), "finished_at": iso(m.finished_at),
            "block": {"category": m.block_category, "rules_version": m.rules_version}
            if m.status == "blocked" else None}
