"""The same event codec for faust agents: register once, name it in ``value_serializer``."""
from __future__ import annotations

from typing import Any

from faust.serializers import codecs

from schemas import Event, decode, encode

CODEC_NAME = "parley"


class EventCodec(codecs.Codec):
    """Bytes <-> ``schemas`` events; decode errors propagate as ``EventDecodeError``."""

    def _dumps(self, obj: Any) -> bytes:
        if not isinstance(obj, Event):
            raise TypeError(f"only schemas.Event is serialised on Parley topics, not {type(obj).__name__}")
        return encode(obj)

    def _loads(self, s: bytes) -> Any:
        return decode(s)


def register() -> None:
    if CODEC_NAME not in codecs.codecs:
        codecs.register(CODEC_NAME, EventCodec())
