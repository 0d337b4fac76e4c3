"""Conversations and their history: create, list newest first, read every message and sibling."""
from __future__ import annotations

from datetime import datetime
from typing import Any

from fastapi import APIRouter, Depends, Query, Request
from pydantic import BaseModel, Field

from infra.stores.accounts import User
from infra.stores.conversations import Message
from producers.gateway.auth import current_user, gateway_of
from producers.gateway.errors import ApiError, not_found, responses
from producers.gateway.text import Text

router = APIRouter(prefix="/v1", tags=["conversations"], responses=responses(401, 422, 503))


class NewConversation(BaseModel):
    title: Text | None = Field(default=None, max_length=200)
    model: Text | None = None


@router.post("/conversations", status_code=201)
async def create_conversation(request: Request, body: NewConversation | None = None,
                              user: User = Depends(current_user)) -> dict[str, Any]:
    gw = gateway_of(request)
    if body and body.model and body.model not in gw.models:
        raise ApiError(422, "unknown_model", f"Unknown model {body.model!r}. Choose one of: {', '.join(gw.models)}.")
    conv = await gw.conversations.create(user.user_id, model=body.model if body else None,
                                         title=body.title if body else None)
    return {"conversation_id": conv.conversation_id}


@router.get("/conversations", responses=responses(400))
async def list_conversations(request: Request, cursor: str | None = None, limit: int = Query(20, ge=1, le=100),
                             user: User = Depends(current_user)) -> dict[str, Any]:
    gw, scope = gateway_of(request), f"conversations:{user.user_id}"
    items, state = await gw.conversations.list_for_user(user.user_id, gw.cursors.open(scope, cursor), limit)
    next_cursor = gw.cursors.sign(scope, state)
    return {"items": [{"conversation_id": c.conversation_id, "title": c.title, "model": c.model,
                       "updated_at": _iso(c.updated_at)} for c in items], "next_cursor": next_cursor}


@router.get("/conversations/{conversation_id}/messages", responses=responses(400, 404))
async def list_messages(request: Request, conversation_id: str, cursor: str | None = None,
                        limit: int = Query(100, ge=1, le=500), user: User = Depends(current_user)) -> dict[str, Any]:
    gw = gateway_of(request)
    scope = f"messages:{conversation_id}"
    paging_state = gw.cursors.open(scope, cursor)  # before any store sees it, ownership checked or not
    conv = await gw.conversations.get(conversation_id)
    if conv is None or conv.user_id != user.user_id:
        raise not_found("conversation")
    items, state = await gw.conversations.messages(conversation_id, paging_state, limit)
    next_cursor = gw.cursors.sign(scope, state)
    return {"conversation_id": conversation_id, "title": conv.title,
            "items": [message_json(m) for m in items], "next_cursor": next_cursor}


def message_json(m: Message) -> dict[str, Any]:
    return {"message_id": m.message_id, "turn": m.turn, "role": m.role, "content": m.content, "status": m.status,
            "parent_id": m.parent_id, "generation_id": m.generation_id, "model": m.model, "pool": m.pool,
            "route_reason": m.route_reason, "usage": {"in": m.tokens_in or 0, "out": m.tokens_out or 0,
                                                      "cached": m.tokens_cached or 0},
            "created_at": _iso(m.created_at), "finished_at": _iso(m.finished_at)}


def _iso(ts: datetime | None) -> str | None:
    return ts.isoformat() + ("Z" if ts.tzinfo is None else "") if ts else None
