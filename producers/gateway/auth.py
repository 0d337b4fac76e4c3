"""Who is calling: a bearer token, or the page's session cookie (a server-side session, never the token).

A request that rides on the cookie and changes something must come from an allowed origin (the
configured public URL, or loopback at this gateway's port: ``origins``), never one derived from the
request's own Host. The cookie is SameSite=Strict already, and the Origin check stops what SameSite
does not (a sibling subdomain, an old browser, DNS rebinding). Bearer calls need no such check: a
browser never attaches an Authorization header by itself.
"""
from __future__ import annotations

from urllib.parse import urlsplit

from fastapi import Request

from infra.stores.accounts import User
from producers.gateway.errors import ApiError, unauthorized
from producers.gateway.origins import allowed_origins
from producers.gateway.state import Gateway

SESSION_COOKIE = "parley_session"
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


def gateway_of(request: Request) -> Gateway:
    gateway: Gateway = request.app.state.gateway  # set by create_app
    return gateway


async def current_user(request: Request) -> User:
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    if header:
        if scheme.lower() != "bearer" or not token.strip():
            raise unauthorized("The Authorization header must be 'Bearer <token>'.")
        user = await gateway_of(request).user_for_token(token.strip())
        if user is None:
            raise unauthorized("That token is not valid. Create one with `parley user create`.")
        return user
    session_id = request.cookies.get(SESSION_COOKIE, "")
    if not session_id:
        raise unauthorized()
    check_same_origin(request)
    user = await gateway_of(request).user_for_session(session_id)
    if user is None:
        raise unauthorized("Your session has ended. Sign in again.")
    return user


def check_same_origin(request: Request, required: bool = True) -> None:
    """Refuse a state-changing request from another origin (403); reading is left to SameSite and CORS.

    ``required=False`` lets a request that names no origin at all through: right where no cookie is
    spent (signing in), since every browser names the origin of a cross-site POST or DELETE.
    """
    if request.method in SAFE_METHODS:
        return
    origin = request.headers.get("origin") or _origin_of(request.headers.get("referer", ""))
    if origin is None and not required:
        return
    if origin is None or origin.lower() not in own_origins(request):
        raise ApiError(403, "cross_origin", "This request came from another site, so it was refused. "
                                            "Use the Parley page itself, or send a bearer token.")


def own_origins(request: Request) -> frozenset[str]:
    server = request.scope.get("server")  # the socket's own address, not the request's Host header
    return allowed_origins(gateway_of(request).settings, server[1] if server else None,
                           request.headers.get("host", ""))


def _origin_of(url: str) -> str | None:
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}" if parts.scheme and parts.netloc else None
