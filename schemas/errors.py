"""The root of Parley's own exceptions, and the errors raised while turning bytes into events."""
from __future__ import annotations


class ParleyError(Exception):
    """The root every Parley exception class derives from, so a reader (or a handler) can tell the project's
    own failures from a library's. ``status`` is the HTTP status a user sees for it, where one does (the
    gateway's API errors); None for failures no user is shown. Subclasses keep their other bases (ValueError,
    RuntimeError, ...), so every ``except`` that caught them still does."""

    status: int | None = None


class EventDecodeError(ParleyError, ValueError):
    """A record could not become an event; consumers dead-letter it instead of crashing."""


class MalformedEvent(EventDecodeError):
    """Not JSON, not an object, an unknown type, or a field of the wrong shape."""


class UnsupportedVersion(EventDecodeError):
    """A known event type at a schema version this code does not understand."""

    def __init__(self, type_name: str, version: int, supported: int) -> None:
        super().__init__(f"{type_name} v{version} is not supported (this build reads v{supported})")
        self.type_name, self.version, self.supported = type_name, version, supported
