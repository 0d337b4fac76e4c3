"""A lean HTTP/1.1 SSE reader on asyncio streams, so hundreds of clients in one process cost little and
each frame is timestamped the moment its chunk arrives (httpx's line iterator costs several times more)."""
from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import orjson

from producers.loadgen.client import Frame
from producers.loadgen.client import parse_frame as _parse


class HttpError(Exception):
    def __init__(self, status: int, body: bytes) -> None:
        super().__init__(f"HTTP {status}: {body[:300]!r}")
        self.status, self.body = status, body




class SseStream:
    """One request whose response is an event stream; iterate it for frames, then ``close``."""

    def __init__(self, port: int, method: str, path: str, token: str, body: Any = None,
                 headers: dict[str, str] | None = None) -> None:
        self.port, self.method, self.path, self.token, self.body = port, method, path, token, body
        self.headers = headers or {}
        self.writer: asyncio.StreamWriter | None = None
        self.reader: asyncio.StreamReader | None = None
        self.opened = 0.0  # when the request was sent

    async def open(self) -> None:
        self.reader, self.writer = await asyncio.open_connection("127.0.0.1", self.port)
        payload = orjson.dumps(self.body) if self.body is not None else b""
        lines = [f"{self.method} {self.path} HTTP/1.1", "Host: 127.0.0.1", f"Authorization: Bearer {self.token}",
                 "Accept: text/event-stream", f"Content-Length: {len(payload)}"]
        lines += ["Content-Type: application/json"] if self.body is not None else []
        lines += [f"{k}: {v}" for k, v in self.headers.items()]
        self.opened = time.time()
        self.writer.write(("\r\n".join(lines) + "\r\n\r\n").encode() + payload)
        status, head = await self._head()
        if status != 200:
            raise HttpError(status, await self._body(head))

    async def _head(self) -> tuple[int, dict[str, str]]:
        assert self.reader is not None
        raw = await self.reader.readuntil(b"\r\n\r\n")
        first, *rest = raw.decode("latin-1").split("\r\n")
        head = {k.strip().lower(): v.strip() for k, _, v in (h.partition(":") for h in rest if h)}
        return int(first.split()[1]), head

    async def _body(self, head: dict[str, str]) -> bytes:
        assert self.reader is not None
        if "content-length" in head:
            return await self.reader.readexactly(int(head["content-length"]))
        return b"".join([c async for c in self._chunks()])

    async def _chunks(self) -> AsyncIterator[bytes]:
        assert self.reader is not None
        while True:
            size = int((await self.reader.readuntil(b"\r\n")).split(b";")[0], 16)
            if size == 0:
                return
            chunk = await self.reader.readexactly(size + 2)
            yield chunk[:-2]

    async def frames(self) -> AsyncIterator[Frame]:
        buffer = b""
        async for chunk in self._chunks():
            received = time.time()
            buffer += chunk
            while b"\n\n" in buffer:
                raw, buffer = buffer.split(b"\n\n", 1)
                frame = _parse(raw, received)
                if frame is not None:
                    yield frame

    async def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            try:
                await self.writer.wait_closed()
            except (ConnectionError, OSError):
                pass


def is_end(frame: Frame) -> bool:
    return frame.event in ("message_end", "error")
