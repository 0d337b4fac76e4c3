"""Share links: a read-only snapshot of a conversation that anyone with the link can read, no account needed.

``POST /v1/conversations/{id}/share`` seals the branch on screen as it is now (later messages are not in
it); ``GET /v1/shares/{share_id}`` answers it without authentication, naming no user, conversation or
message id; the owner lists and revokes shares. Deleting the conversation revokes its shares
(``infra/stores/purging.py``). The page that shows a share is ``/s/{share_id}`` (``routes_web``).
"""
from __future__ import annotations

import re
from typing import Any

from fastapi import APIRouter, Depends, Query, Request, Response
from fastapi.responses import FileResponse
from pydantic import BaseModel, Field

from infra.stores.accounts import User
from infra.stores.conversations import Message
from infra.stores.shares import MAX_SHARES_PER_USER, Share, Shares, TooManyShares
from producers.gateway import transcript
from producers.gateway.auth import current_user, gateway_of
from producers.gateway.errors import ApiError, not_found, responses
from producers.gateway.routes_export import history, owned
from producers.gateway.routes_web import PAGE_HEADERS, STATIC
from producers.gateway.state import Gateway

router = APIRouter(prefix="/v1", tags=["shares"], responses=responses(422, 503))

SHARE_ID = re.compile(r"[A-Za-z0-9_-]{16,64}")
# Anyone may read a share, so nothing in its answer may be indexed or cached past a revoke.
PUBLIC_HEADERS = {"X-Robots-Tag": "noindex, nofollow", "Cache-Control": "no-store", "Referrer-Policy": "no-referrer"}


def shown(m: Message) -> bool:
    """In a snapshot: what was said; not a reply still being written, nor one that ended with no text."""
    return m.role == "user" or (m.status != "generating" and bool(m.content))


def shares_of(gw: Gateway) -> Shares:
    return Shares(gw.conversations.db, gw.sealer)


def _share_json(s: Share) -> dict[str, Any]:
    return {"share_id": s.share_id, "conversation_id": s.conversation_id, "path": f"/s/{s.share_id}",
            "created_at": transcript.iso(s.created_at), "message_count": s.message_count}


def _shared_message(m: Message) -> dict[str, Any]:
    return {"role": m.role, "content": m.content, "status": m.status, "model": m.model if m.role == "assistant"
            else None, "created_at": transcript.iso(m.created_at)}


class NewShare(BaseModel):
    message_id: str | None = Field(default=None, max_length=64,
                                   description="the last message of the branch to share (the one on screen); "
                                               "default: the newest branch")


@router.post("/conversations/{conversation_id}/share", status_code=201, responses=responses(401, 404, 429))
async def create_share(request: Request, conversation_id: str, body: NewShare | None = None,
                       user: User = Depends(current_user)) -> dict[str, Any]:
    gw = gateway_of(request)
    conv = await owned(gw, conversation_id, user)
    last_id = body.message_id if body else None
    messages = [m for m in transcript.branch(await history(gw, conversation_id), last_id) if shown(m)]
    if not messages:
        raise (not_found("message") if last_id else
               ApiError(422, "nothing_to_share", "This conversation has no finished message yet."))
    content = {"title": conv.title, "messages": [_shared_message(m) for m in messages]}
    try:
        share = await shares_of(gw).create(user.user_id, conversation_id, content)
    except TooManyShares:
        raise ApiError(429, "too_many_shares", f"You have {MAX_SHARES_PER_USER} share links, the most one "
                                               "account can keep. Revoke some, then try again.") from None
    return _share_json(share)


@router.get("/shares", responses=responses(401))
async def list_shares(request: Request, conversation_id: str | None = Query(None, max_length=64),
                      user: User = Depends(current_user)) -> dict[str, Any]:
    """The caller's share links, newest first (of one conversation if given)."""
    shares = await shares_of(gateway_of(request)).of_user(user.user_id, conversation_id)
    return {"items": [_share_json(s) for s in shares]}


@router.get("/shares/{share_id}", responses=responses(404))
async def read_share(request: Request, share_id: str, response: Response) -> dict[str, Any]:
    """No authentication: the snapshot's title and messages (role, text, status, model, time), nothing else."""
    snapshot = await shares_of(gateway_of(request)).read(share_id) if SHARE_ID.fullmatch(share_id) else None
    if snapshot is None:
        raise ApiError(404, "not_found", "No such shared conversation: the link is wrong, or it was revoked "
                                         "or its conversation deleted.")
    response.headers.update(PUBLIC_HEADERS)
    return {"share_id": share_id, "title": snapshot.content.get("title"),
            "created_at": transcript.iso(snapshot.created_at), "messages": snapshot.content.get("messages", [])}


@router.delete("/shares/{share_id}", status_code=204, responses=responses(401, 404))
async def revoke_share(request: Request, share_id: str, user: User = Depends(current_user)) -> Response:
    """The link answers 404 from now on, on every gateway."""
    shares = shares_of(gateway_of(request))
    if not SHARE_ID.fullmatch(share_id) or await shares.owner(share_id) != user.user_id:
        raise not_found("share")
    await shares.revoke(user.user_id, share_id)
    return Response(status_code=204)


page_router = APIRouter(include_in_schema=False)


@page_router.get("/s/{share_id}")
async def share_page(share_id: str) -> FileResponse:
    """The same page for every share id (it reads the share from the API): nothing about the share in it."""
    return FileResponse(STATIC / "share.html", media_type="text/html", headers={**PAGE_HEADERS, **PUBLIC_HEADERS})
