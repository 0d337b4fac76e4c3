"""The page's sign-in: a bearer token traded for a server-side session, and demo users in local mode.

The browser's ``EventSource`` cannot send an Authorization header, so the page signs in once
with ``POST /v1/session`` and every later call (and every stream) carries the session cookie
instead: a random id, HttpOnly, SameSite=Strict, Secure over TLS, that expires with the session
in Redis and that ``DELETE /v1/session`` revokes. The API token itself never goes into a cookie.
"""
from __future__ import annotations

from typing import Any, Literal

from fastapi import APIRouter, Request, Response
from pydantic import BaseModel, Field

from infra.config.settings import is_loopback
from infra.stores.accounts import User
from producers.gateway.auth import SESSION_COOKIE, check_same_origin, gateway_of
from producers.gateway.errors import ApiError, responses, unauthorized
from producers.gateway.text import Text

router = APIRouter(prefix="/v1", tags=["session"])


class SignIn(BaseModel):
    token: Text = Field(description="a bearer token (`parley user create` or `parley up` prints one)")


class DemoUser(BaseModel):
    # Free only: anyone who can reach a local gateway may make one, and paid traffic jumps the queue.
    plan: Literal["free"] = Field(default="free", description="demo users are always on the free plan")


@router.get("/session")
async def who_am_i(request: Request) -> dict[str, Any]:
    """Who the session cookie belongs to (``user`` is null when signed out), and whether demo users are on."""
    session_id = request.cookies.get(SESSION_COOKIE, "")
    user = await gateway_of(request).user_for_session(session_id) if session_id else None
    return {"user": _user_json(user) if user else None, "local_mode": _local(request)}


@router.post("/session", responses=responses(401, 422, 503))
async def sign_in(request: Request, body: SignIn, response: Response) -> dict[str, Any]:
    check_same_origin(request, required=False)  # no signing a browser into someone else's account from another site
    token = body.token.strip()
    user = await gateway_of(request).user_for_token(token) if token else None
    if user is None:
        raise unauthorized("That token is not valid. `parley up` prints the demo user's; "
                           "`parley user create` makes another.")
    await _start_session(request, response, user)
    return {"user": _user_json(user)}


@router.delete("/session", status_code=204)
async def sign_out(request: Request, response: Response) -> None:
    """Ends the session on the server: the cookie is refused from now on, wherever a copy of it is."""
    check_same_origin(request, required=False)
    await gateway_of(request).sessions.revoke(request.cookies.get(SESSION_COOKIE, ""))
    response.delete_cookie(SESSION_COOKIE, path="/", secure=_tls(request), httponly=True, samesite="strict")


@router.post("/session/demo", status_code=201, responses=responses(403, 422, 503))
async def demo_user(request: Request, response: Response, body: DemoUser | None = None) -> dict[str, Any]:
    """A fresh user, signed in at once. Local mode only: anyone who can reach this gets an account."""
    check_same_origin(request, required=False)
    if not _local(request):
        raise ApiError(403, "not_local", "Demo users can only be made on a local service. "
                                         "Sign in with a token from `parley user create`.")
    user, token = await gateway_of(request).accounts.create_user("free", "demo")
    await _start_session(request, response, user)
    return {"user": _user_json(user), "token": token}


def _local(request: Request) -> bool:
    # Both: the service says it is local, and this caller is on this machine (a gateway bound to
    # 0.0.0.0 by mistake still hands no accounts to the network).
    client = request.client.host if request.client else ""
    return gateway_of(request).settings.local_mode and is_loopback(client)


async def _start_session(request: Request, response: Response, user: User) -> None:
    gw = gateway_of(request)
    await gw.sessions.revoke(request.cookies.get(SESSION_COOKIE, ""))  # signing in again replaces the old one
    session_id = await gw.sessions.create(user.user_id)
    response.set_cookie(SESSION_COOKIE, session_id, max_age=gw.settings.session_ttl_s, path="/",
                        secure=_tls(request), httponly=True, samesite="strict")


def _tls(request: Request) -> bool:
    # uvicorn turns a trusted proxy's X-Forwarded-Proto into the scheme, so TLS ended at a proxy counts.
    return request.url.scheme == "https"


def _user_json(user: User) -> dict[str, Any]:
    return {"user_id": user.user_id, "plan": user.plan, "display_name": user.display_name}
