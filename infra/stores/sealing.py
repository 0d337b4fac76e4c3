"""Sealing the text inside events and rows with the conversation's data key.

A sealed value is a string ``pe1.<base64url(nonce | AES-GCM ciphertext+tag)>``, authenticated
with the conversation id (a value copied into another conversation does not open). Text is
sealed as UTF-8, token ids as little-endian uint32, a client-sent history as JSON.

``SEALED_FIELDS`` is the one list of event fields that carry user or model text; producers
call ``seal(event)`` before sending, consumers ``open(event)`` after decoding. Values that
are not sealed (empty ones, and rows written before sealing existed) are returned as they are.
"""
from __future__ import annotations

import base64
import hashlib
import hmac
import os
import sys
from array import array
from typing import Any, Protocol, TypeGuard, TypeVar, cast

import msgspec
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from infra.config.settings import Settings
from infra.stores.crypto import NONCE_BYTES, DataKeys, KeyGone, LocalTenantKeys
from infra.stores.session import AsyncSession
from schemas import (
    Event,
    GenerationFinished,
    GenerationRequested,
    MessageSubmitted,
    PromptBuilt,
    RequestAdmitted,
    TokensAppended,
)
from schemas.gateway import ChatTurn
from schemas.prompt import PoolPrompt
from schemas.sampling import Sampling, TokenLogprob

PREFIX = "pe1."
E = TypeVar("E", bound=Event)

# Field -> kind of value: "text" (str), "ids" (list[int]), or a JSON kind of ``_JSON`` (the client's history,
# its sampling parameters, which hold stop sequences and schemas, and token logprobs, which hold token text).
SEALED_FIELDS: dict[type[Event], dict[str, str]] = {
    MessageSubmitted: {"content": "text", "history": "turns", "sampling": "sampling", "instructions": "text"},
    RequestAdmitted: {"content": "text", "history": "turns", "sampling": "sampling", "instructions": "text"},
    PromptBuilt: {"prompt_token_ids": "ids", "question": "text", "sampling": "sampling", "alternates": "alternates"},
    GenerationRequested: {"prompt_token_ids": "ids", "sampling": "sampling", "question": "text"},
    TokensAppended: {"text": "text", "token_ids": "ids", "logprobs": "logprobs"},
    GenerationFinished: {"text": "text", "question": "text"},
}
# Events whose sealed fields travel as one payload in one field: one seal per record, not one per field.
# Records sealed field by field (written before) still open through SEALED_FIELDS.
SEALED_TOGETHER: dict[type[Event], str] = {TokensAppended: "sealed"}
_TOGETHER = msgspec.msgpack.Decoder(tuple[str, list[int], list[TokenLogprob] | None])
_JSON: dict[str, msgspec.json.Decoder[Any]] = {
    "turns": msgspec.json.Decoder(list[ChatTurn]),
    "sampling": msgspec.json.Decoder(Sampling),
    "logprobs": msgspec.json.Decoder(list[TokenLogprob]),
    "alternates": msgspec.json.Decoder(list[PoolPrompt]),
}


def is_sealed(value: object) -> TypeGuard[str]:
    return isinstance(value, str) and value.startswith(PREFIX)


class _InConversation(Protocol):
    conversation_id: str


def _conversation_of(event: object) -> str:
    """Every event with sealed fields (``SEALED_FIELDS``, ``SEALED_TOGETHER``) belongs to one conversation."""
    return cast(_InConversation, event).conversation_id


def seal_bytes(key: AESGCM, conversation_id: str, data: bytes) -> str:
    nonce = os.urandom(NONCE_BYTES)
    return PREFIX + base64.urlsafe_b64encode(nonce + key.encrypt(nonce, data, conversation_id.encode())).decode()


def open_bytes(key: AESGCM, conversation_id: str, sealed: str) -> bytes:
    raw = base64.urlsafe_b64decode(sealed[len(PREFIX):])
    try:
        return key.decrypt(raw[:NONCE_BYTES], raw[NONCE_BYTES:], conversation_id.encode())
    except InvalidTag as exc:  # another conversation's value, or a tampered one
        raise KeyGone(conversation_id) from exc


def _pack(kind: str, value: Any) -> bytes:
    if kind == "text":
        return str(value).encode()
    if kind == "ids":
        ids = array("I", value)
        if sys.byteorder != "little":
            ids.byteswap()
        return ids.tobytes()
    return msgspec.json.encode(value)


def _unpack(kind: str, data: bytes) -> Any:
    if kind == "text":
        return data.decode()
    if kind == "ids":
        ids = array("I")
        ids.frombytes(data)
        if sys.byteorder != "little":
            ids.byteswap()
        return ids.tolist()
    return _JSON[kind].decode(data)


class Sealer:
    """Seals and opens values of one conversation with its data key (``DataKeys`` caches them)."""

    def __init__(self, keys: DataKeys) -> None:
        self.keys = keys

    async def seal(self, event: E) -> E:
        together = SEALED_TOGETHER.get(type(event))
        if together is not None:
            return await self._seal_together(event, together)
        fields = SEALED_FIELDS.get(type(event))
        if not fields:
            return event
        changes = {}
        for name, kind in fields.items():
            value = getattr(event, name)
            if value and not is_sealed(value):
                conversation_id = _conversation_of(event)
                key = await self.keys.get(conversation_id)
                changes[name] = seal_bytes(key, conversation_id, _pack(kind, value))
        return msgspec.structs.replace(event, **changes) if changes else event

    async def _seal_together(self, event: Any, field: str) -> Any:
        """Text, token ids and logprobs packed (msgpack) and sealed once into ``field``; the three left empty."""
        if getattr(event, field) or not (event.text or event.token_ids or event.logprobs):
            return event
        if is_sealed(event.text) or is_sealed(event.token_ids) or is_sealed(event.logprobs):
            return event  # sealed field by field already
        key = await self.keys.get(event.conversation_id)
        packed = msgspec.msgpack.encode((event.text, event.token_ids, event.logprobs))
        return msgspec.structs.replace(event, text="", token_ids=[], logprobs=None,
                                       **{field: seal_bytes(key, event.conversation_id, packed)})

    async def open(self, event: E) -> E:
        """The event with its text back; ``KeyGone`` when the conversation's key was destroyed."""
        together = SEALED_TOGETHER.get(type(event))
        if together is not None and is_sealed(getattr(event, together)):
            conversation_id = _conversation_of(event)
            key = await self.keys.get(conversation_id)
            text, ids, logprobs = _TOGETHER.decode(open_bytes(key, conversation_id, getattr(event, together)))
            return msgspec.structs.replace(event, text=text, token_ids=ids, logprobs=logprobs, **{together: ""})
        fields = SEALED_FIELDS.get(type(event))
        if not fields:
            return event
        changes = {}
        for name, kind in fields.items():
            value = getattr(event, name)
            if is_sealed(value):
                conversation_id = _conversation_of(event)
                key = await self.keys.get(conversation_id)
                changes[name] = _unpack(kind, open_bytes(key, conversation_id, value))
        return msgspec.structs.replace(event, **changes) if changes else event

    async def seal_text(self, conversation_id: str, text: str | None) -> str | None:
        if not text or is_sealed(text):
            return text
        return seal_bytes(await self.keys.get(conversation_id), conversation_id, text.encode())

    async def open_text(self, conversation_id: str, value: str | None) -> str | None:
        """Text of a stored value; a value whose key is gone reads as None (never as ciphertext)."""
        if not is_sealed(value):
            return value
        try:
            key = await self.keys.get(conversation_id)
            return open_bytes(key, conversation_id, value).decode()
        except KeyGone:
            return None

    def digest(self, user_id: str, *parts: str) -> str:
        """A keyed hash of text that is matched but never read back (a client_message_id, a content
        fingerprint): HMAC-SHA256 under the user's tenant index key, so a short text cannot be guessed from it."""
        mac = hmac.new(self.keys.tenants.index_key(user_id), "\0".join(parts).encode(), hashlib.sha256)
        return mac.hexdigest()[:32]

    async def seal_values(self, conversation_id: str, record: dict[str, Any], names: tuple[str, ...]) -> dict[str, Any]:
        """``record`` with each of ``names`` that holds something sealed as JSON (a record kept in Redis, such
        as a response's request fields: instructions, metadata)."""
        out = dict(record)
        for name in names:
            if out.get(name) and not is_sealed(out[name]):
                out[name] = await self.seal_text(conversation_id, msgspec.json.encode(out[name]).decode())
        return out

    async def open_values(self, conversation_id: str, record: dict[str, Any], names: tuple[str, ...]) -> dict[str, Any]:
        """The reverse of ``seal_values``; a value whose key is gone reads as None."""
        out = dict(record)
        for name in names:
            if is_sealed(out.get(name)):
                text = await self.open_text(conversation_id, out[name])
                out[name] = None if text is None else msgspec.json.decode(text)
        return out


def configured(settings: Settings, db: AsyncSession, redis: Any = None) -> Sealer:
    """The process's sealer: the embedded tenant key file under the state dir, data keys in Cassandra (kept
    longer while ``redis`` carries their destructions: ``DataKeys``)."""
    return Sealer(DataKeys(db, LocalTenantKeys.under(settings.state_dir), settings.key_cache_s, redis))
