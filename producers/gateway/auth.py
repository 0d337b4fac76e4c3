"""Who is calling: a bearer token (or the session cookie the page gets at sign-in), mapped to the account."""
from __future__ import annotations

from fastapi import Request

from infra.stores.accounts import User
from producers.gateway.errors import unauthorized
from producers.gateway.state import Gateway

SESSION_COOKIE = "parley_session"


def gateway_of(request: Request) -> Gateway:
    return request.app.state.gateway  # type: ignore[no-any-return]


async def current_user(request: Request) -> User:
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    if not header:
        token = request.cookies.get(SESSION_COOKIE, "")
        if not token:
            raise unauthorized()
    elif scheme.lower() != "bearer" or not token.strip():
        raise unauthorized("The Authorization header must be 'Bearer <token>'.")
    user = await gateway_of(request).user_for_token(token.strip())
    if user is None:
        raise unauthorized("That token is not valid. Create one with `parley user create`.")
    return user
