"""Bytes <-> events, one codec for aiokafka producers/consumers and faust agents.

``decode`` raises ``MalformedEvent`` or ``UnsupportedVersion`` (both
``EventDecodeError``) so a consumer can dead-letter the record and move on.
"""
from __future__ import annotations

from functools import cache
from typing import Any, Union

import msgspec

from schemas.admission import RequestAdmitted, RequestRefused
from schemas.base import Event
from schemas.deadletter import EventDeadLettered
from schemas.deletion import ConversationDeleted, ConversationPurged
from schemas.errors import MalformedEvent, UnsupportedVersion
from schemas.gateway import CancelRequested, MessageSubmitted
from schemas.generation import GenerationFinished, GenerationStarted, TokensAppended
from schemas.prompt import PromptBuilt
from schemas.safety import GenerationRetracted, InputBlocked
from schemas.scheduler import GenerationQueued, GenerationRequested
from schemas.settlement import UsageRecorded

ALL_EVENTS: tuple[type[Event], ...] = (
    MessageSubmitted,
    CancelRequested,
    RequestAdmitted,
    RequestRefused,
    InputBlocked,
    PromptBuilt,
    GenerationQueued,
    GenerationRequested,
    GenerationStarted,
    TokensAppended,
    GenerationRetracted,
    GenerationFinished,
    UsageRecorded,
    EventDeadLettered,
    ConversationDeleted,
    ConversationPurged,
)

_encoder = msgspec.json.Encoder()
# A token record's default time, the very object: msgspec leaves a field out when it *is* its default.
_UNWRITTEN_TIME = next(f.default for f in msgspec.structs.fields(TokensAppended) if f.name == "at")


def encode(event: Event) -> bytes:
    return _encoder.encode(event)


@cache
def _decoder(types: tuple[type[Event], ...]) -> msgspec.json.Decoder[Any]:
    target: Any = types[0] if len(types) == 1 else Union[types]  # noqa: UP007 - runtime union of classes
    return msgspec.json.Decoder(target)


def decode(data: bytes | str, types: tuple[type[Event], ...] = ALL_EVENTS, key: bytes | None = None,
           timestamp_ms: int | None = None) -> Event:
    """Decode one record into one of ``types``; raise a specific error otherwise. ``key``: the record's key, the
    generation id of an event whose value leaves it out (a token record); ``timestamp_ms``: the record's
    timestamp, the time of an event whose value leaves it out (a token record)."""
    try:
        event: Event = _decoder(types).decode(data)
    except msgspec.DecodeError as exc:  # ValidationError is a DecodeError
        raise MalformedEvent(str(exc)) from exc
    if event.v != type(event).VERSION:
        raise UnsupportedVersion(type(event).__name__, event.v, type(event).VERSION)
    given: dict[str, Any] = {}
    if key and getattr(event, "generation_id", None) == "":
        given["generation_id"] = key.decode()
    if timestamp_ms and event.at == 0.0:
        given["at"] = timestamp_ms / 1000
    return msgspec.structs.replace(event, **given) if given else event


def decode_record(record: Any, types: tuple[type[Event], ...] = ALL_EVENTS) -> Event:
    """``decode`` of a Kafka record's value, with its key and timestamp."""
    return decode(record.value, types, record.key, getattr(record, "timestamp", None))


def keyless(event: Event) -> bytes:
    """``encode`` of a token record without what the record itself gives: the generation id (its key) and the
    time (its timestamp). ``decode_record`` fills both in."""
    return encode(msgspec.structs.replace(event, generation_id="", at=_UNWRITTEN_TIME))
