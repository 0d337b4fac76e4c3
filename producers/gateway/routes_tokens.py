"""The caller's API tokens, for the page's settings: list (never a secret), make one, revoke one.

A revocation holds at once on every gateway (``tokens.py``): the next request with that token is a 401,
whichever gateway it reaches. A token may revoke itself.
"""
from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from fastapi import APIRouter, Depends, Request, Response
from pydantic import BaseModel, Field

from infra.stores.accounts import MAX_LIVE_TOKENS, MAX_TTL_DAYS, TokenInfo, TooManyTokens, User
from producers.gateway.auth import current_user, gateway_of
from producers.gateway.errors import ApiError, not_found, responses
from producers.gateway.text import Text

router = APIRouter(prefix="/v1", tags=["tokens"], responses=responses(401, 422, 503))


class NewToken(BaseModel):
    name: Text | None = Field(default=None, max_length=100, description="a label to tell tokens apart")
    expires_in_days: int | None = Field(default=None, ge=1, le=MAX_TTL_DAYS,
                                        description="default: the service's token life (90 days unless configured)")


def token_json(t: TokenInfo, now: datetime) -> dict[str, Any]:
    return {"token_id": t.token_id, "name": t.name, "status": t.status(now), "created_at": _iso(t.created_at),
            "expires_at": _iso(t.expires_at), "revoked_at": _iso(t.revoked_at)}


@router.get("/tokens")
async def list_tokens(request: Request, user: User = Depends(current_user)) -> dict[str, Any]:
    """The caller's tokens, newest first: id, name, status (active, expired, revoked) and dates; no secret."""
    now = datetime.now(UTC)
    return {"items": [token_json(t, now) for t in await gateway_of(request).accounts.tokens_of(user.user_id)]}


@router.post("/tokens", status_code=201, responses=responses(409))
async def create_token(request: Request, body: NewToken | None = None,
                       user: User = Depends(current_user)) -> dict[str, Any]:
    """A new token for the caller; its secret is in this answer and nowhere else, ever."""
    body = body or NewToken()
    try:
        issued = await gateway_of(request).accounts.issue_limited(user.user_id, body.name, body.expires_in_days)
    except TooManyTokens as exc:
        raise ApiError(409, "too_many_tokens", f"You already have {MAX_LIVE_TOKENS} live tokens. "
                                               "Revoke one you no longer use first.") from exc
    return {"token_id": issued.token_id, "token": issued.token, "name": body.name,
            "expires_at": _iso(issued.expires_at)}


@router.delete("/tokens/{token_id}", status_code=204, responses=responses(404))
async def revoke_token(request: Request, token_id: str, user: User = Depends(current_user)) -> Response:
    """Revoke one of the caller's tokens, on every gateway at once; again is a 204, someone else's a 404."""
    if len(token_id) > 64 or not await gateway_of(request).tokens.revoke(user.user_id, token_id):
        raise not_found("token")
    return Response(status_code=204)


def _iso(at: datetime | None) -> str | None:
    return at.isoformat() if at is not None else None
