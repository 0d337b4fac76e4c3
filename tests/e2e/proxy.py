"""A loopback TCP proxy in front of a gateway (or a store), so a test can drop a browser's connections
mid-reply, or make a store unreachable for a while.

The browser's own offline switch leaves open streams alone, and killing the gateway would take the
page's origin away; cutting the TCP connections between them is what a flaky network does.
"""
from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import Self


class DroppingProxy:
    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self.port = 0
        self.drops = 0
        self.refusing = False  # while set, new connections are cut at once: the upstream looks down
        self.requests: list[tuple[str, str | None]] = []  # (path, Last-Event-ID) of each request seen
        self._server: asyncio.Server | None = None
        self._open: set[asyncio.StreamWriter] = set()

    async def __aenter__(self) -> Self:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        self.drop()
        await self._server.wait_closed()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def drop(self) -> None:
        """Cut every connection open now (both sides), as a lost network would."""
        for writer in list(self._open):
            with contextlib.suppress(Exception):
                writer.transport.abort()
        self._open.clear()
        self.drops += 1

    def cut(self) -> None:
        """Drop every connection and refuse new ones until ``restore``: an outage of the upstream."""
        self.refusing = True
        self.drop()

    def restore(self) -> None:
        self.refusing = False

    async def _serve(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        if self.refusing:
            client_w.transport.abort()
            return
        try:
            upstream_r, upstream_w = await asyncio.open_connection("127.0.0.1", self.upstream_port)
        except OSError:
            client_w.transport.abort()
            return
        pair = {client_w, upstream_w}
        self._open |= pair
        try:
            await asyncio.gather(_pipe(client_r, upstream_w, self._note), _pipe(upstream_r, client_w))
        finally:
            self._open -= pair
            for w in pair:
                w.transport.abort()

    def _note(self, chunk: bytes) -> None:
        """Request heads going upstream: their path and Last-Event-ID (what the browser really sent)."""
        head, _, _ = chunk.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        parts = lines[0].split(" ")
        if len(parts) == 3 and parts[2].startswith("HTTP/"):
            headers = dict(line.split(":", 1) for line in lines[1:] if ":" in line)
            found = {k.strip().lower(): v.strip() for k, v in headers.items()}.get("last-event-id")
            self.requests.append((parts[1], found))


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                note: Callable[[bytes], None] | None = None) -> None:
    with contextlib.suppress(ConnectionError, OSError):
        while chunk := await reader.read(65536):
            if note is not None:
                note(chunk)
            writer.write(chunk)
            await writer.drain()
    with contextlib.suppress(Exception):
        writer.transport.abort()
