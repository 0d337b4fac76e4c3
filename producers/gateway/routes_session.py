"""The page's sign-in: a bearer token traded for an HttpOnly session cookie, and demo users in local mode.

The browser's ``EventSource`` cannot send an Authorization header, so the page signs in once
with ``POST /v1/session`` and every later call (and every stream) carries the cookie instead.
The cookie is SameSite=Strict, so another site cannot make the browser spend it.
"""
from __future__ import annotations

from typing import Any, Literal

from fastapi import APIRouter, Request, Response
from pydantic import BaseModel, Field

from infra.config.settings import is_loopback
from infra.stores.accounts import User
from producers.gateway.auth import SESSION_COOKIE, gateway_of
from producers.gateway.errors import ApiError, responses, unauthorized
from producers.gateway.text import Text

router = APIRouter(prefix="/v1", tags=["session"])
COOKIE_MAX_AGE_S = 30 * 24 * 3600


class SignIn(BaseModel):
    token: Text = Field(description="a bearer token (`parley user create` or `parley up` prints one)")


class DemoUser(BaseModel):
    # Free only: anyone who can reach a local gateway may make one, and paid traffic jumps the queue.
    plan: Literal["free"] = Field(default="free", description="demo users are always on the free plan")


@router.get("/session")
async def who_am_i(request: Request) -> dict[str, Any]:
    """Who the session cookie belongs to (``user`` is null when signed out), and whether demo users are on."""
    token = request.cookies.get(SESSION_COOKIE, "")
    user = await gateway_of(request).user_for_token(token) if token else None
    return {"user": _user_json(user) if user else None, "local_mode": _local(request)}


@router.post("/session", responses=responses(401, 422, 503))
async def sign_in(request: Request, body: SignIn, response: Response) -> dict[str, Any]:
    token = body.token.strip()
    user = await gateway_of(request).user_for_token(token) if token else None
    if user is None:
        raise unauthorized("That token is not valid. `parley up` prints the demo user's; "
                           "`parley user create` makes another.")
    _set_cookie(response, token)
    return {"user": _user_json(user)}


@router.delete("/session", status_code=204)
async def sign_out(response: Response) -> None:
    response.delete_cookie(SESSION_COOKIE, path="/", secure=True, httponly=True, samesite="strict")


@router.post("/session/demo", status_code=201, responses=responses(403, 422, 503))
async def demo_user(request: Request, response: Response, body: DemoUser | None = None) -> dict[str, Any]:
    """A fresh user, signed in at once. Local mode only: anyone who can reach this gets an account."""
    if not _local(request):
        raise ApiError(403, "not_local", "Demo users can only be made on a local service. "
                                         "Sign in with a token from `parley user create`.")
    user, token = await gateway_of(request).accounts.create_user("free", "demo")
    _set_cookie(response, token)
    return {"user": _user_json(user), "token": token}


def _local(request: Request) -> bool:
    # Both: the service says it is local, and this caller is on this machine (a gateway bound to
    # 0.0.0.0 by mistake still hands no accounts to the network).
    client = request.client.host if request.client else ""
    return gateway_of(request).settings.local_mode and is_loopback(client)


def _set_cookie(response: Response, token: str) -> None:
    # Secure is honoured on http://127.0.0.1 and http://localhost, which browsers treat as secure origins.
    response.set_cookie(SESSION_COOKIE, token, max_age=COOKIE_MAX_AGE_S, path="/", secure=True, httponly=True,
                        samesite="strict")


def _user_json(user: User) -> dict[str, Any]:
    return {"user_id": user.user_id, "plan": user.plan, "display_name": user.display_name}
