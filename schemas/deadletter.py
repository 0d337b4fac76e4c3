"""A record that no stage could read, kept whole for a person to inspect; topic ``chat.deadletter``."""
from __future__ import annotations

from schemas.base import Event


class EventDeadLettered(Event, frozen=True, kw_only=True):
    source_topic: str
    partition: int
    offset: int
    key: str | None
    raw: str  # the record's value, as text (invalid UTF-8 replaced)
    error: str
    consumer_group: str
