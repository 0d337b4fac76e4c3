"""The base of every event: frozen, typed, tagged by class name, versioned.

Wire format is compact JSON (msgspec). Each event class declares ``VERSION``;
the encoder writes it as ``v`` and the decoder refuses versions it does not know.
Ids are time-ordered (UUIDv7 layout) so message ids sort by creation time.
"""
from __future__ import annotations

import os
import time
import uuid
from datetime import UTC, datetime
from typing import ClassVar

import msgspec


class Event(msgspec.Struct, frozen=True, kw_only=True, tag_field="type", forbid_unknown_fields=False):
    VERSION: ClassVar[int] = 1
    v: int = 1
    at: float = msgspec.field(default_factory=time.time)


_last_id = 0


def new_id() -> str:
    """A time-ordered UUID (v7 layout): 48-bit ms timestamp, then randomness.

    Strictly increasing within a process, so a user message made just before its
    reply's generation id sorts first even within the same millisecond.
    """
    global _last_id
    ms = int(time.time() * 1000)
    rand = int.from_bytes(os.urandom(10), "big")
    value = (ms << 80) | (0x7 << 76) | ((rand >> 68) & 0xFFF) << 64 | (0b10 << 62) | (rand & ((1 << 62) - 1))
    if value <= _last_id:
        value = _last_id + 1  # same millisecond: count up in the random bits
    _last_id = value
    return str(uuid.UUID(int=value))


def id_time_ms(id_: str) -> int:
    """Milliseconds since the epoch at which a ``new_id`` was made."""
    return uuid.UUID(id_).int >> 80


def id_time(id_: str) -> datetime | None:
    """When a ``new_id`` was made, to the millisecond; None for an id that is not one (``<id>:summary``)."""
    try:
        return datetime.fromtimestamp(id_time_ms(id_) / 1000, UTC)
    except ValueError:
        return None
