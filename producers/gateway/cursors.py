"""Opaque, signed page cursors.

A cursor wraps the store's own page cursor (Cassandra's paging state) with an HMAC over the listing it belongs to (one
user's conversations, or one conversation's messages). A cursor that was not signed by a
gateway of this service, or that belongs to another listing, is refused with 400 before any
store sees it: raw paging state from a client can make the driver drop its connection.
"""
from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import os
import secrets
from pathlib import Path

from infra.config.settings import Settings
from producers.gateway.errors import ApiError

TAG_BYTES = 16
MAX_CURSOR_CHARS = 2048


def bad_cursor() -> ApiError:
    return ApiError(400, "bad_cursor", "That cursor is not one this API gave out for this list. "
                                       "Start again without a cursor.")


class Cursors:
    def __init__(self, key: bytes) -> None:
        self.key = key

    def sign(self, scope: str, inner: str | None) -> str | None:
        if not inner:
            return None
        state = inner.encode()
        return f"{_b64(state)}.{_b64(self._tag(scope, state))}"

    def open(self, scope: str, cursor: str | None) -> str | None:
        """The store's cursor inside ``cursor``; ``ApiError(400)`` unless this service signed it for ``scope``."""
        if cursor is None or cursor == "":
            return None
        body, dot, tag = cursor.partition(".")
        if not dot or len(cursor) > MAX_CURSOR_CHARS:
            raise bad_cursor()
        try:
            state, given = _unb64(body), _unb64(tag)
        except (binascii.Error, ValueError) as exc:
            raise bad_cursor() from exc
        if not state or not hmac.compare_digest(given, self._tag(scope, state)):
            raise bad_cursor()
        return state.decode()  # signed here, so it is the store's own (ASCII) cursor

    def _tag(self, scope: str, state: bytes) -> bytes:
        return hmac.new(self.key, scope.encode() + b"\0" + state, hashlib.sha256).digest()[:TAG_BYTES]


def cursor_key(settings: Settings) -> bytes:
    """The configured cursor secret, or a random key kept in the state folder (shared by the local gateways)."""
    if settings.cursor_secret:
        return settings.cursor_secret.encode()
    path = Path(settings.state_dir) / "cursor.key"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f"cursor.key.{os.getpid()}")
        tmp.write_bytes(secrets.token_bytes(32))
        tmp.chmod(0o600)
        try:
            os.link(tmp, path)  # atomic and exclusive: two gateways starting at once agree on one key
        except FileExistsError:
            pass
        finally:
            tmp.unlink()
    return path.read_bytes()

def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def _unb64(text: str) -> bytes:
    if not text.isascii():
        raise ValueError("not base64")
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
