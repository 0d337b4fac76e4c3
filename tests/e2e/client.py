"""A small SSE client for tests: parse frames from an httpx streaming response."""
from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import httpx
import orjson


@dataclass
class Frame:
    event: str
    data: Any
    id: int | None


async def frames(response: httpx.Response) -> AsyncIterator[Frame]:
    event, data, id_ = "message", [], None
    async for line in response.aiter_lines():
        if line == "":
            if data:
                yield Frame(event, orjson.loads("\n".join(data)), id_)
            event, data, id_ = "message", [], None
        elif line.startswith(":"):
            continue
        else:
            field, _, value = line.partition(":")
            value = value[1:] if value.startswith(" ") else value
            if field == "event":
                event = value
            elif field == "data":
                data.append(value)
            elif field == "id":
                id_ = int(value)


async def collect(response: httpx.Response, stop_after: int | None = None) -> list[Frame]:
    out = []
    async for f in frames(response):
        out.append(f)
        if f.event in ("message_end", "error") or (stop_after is not None and len(out) >= stop_after):
            break
    return out


def text_of(fs: list[Frame]) -> str:
    return "".join(f.data["text"] for f in fs if f.event == "delta") + "".join(
        f.data["text"] for f in fs if f.event == "snapshot")
