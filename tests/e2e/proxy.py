"""A loopback TCP proxy in front of a gateway, so a test can drop a browser's connections mid-reply.

The browser's own offline switch leaves open streams alone, and killing the gateway would take the
page's origin away; cutting the TCP connections between them is what a flaky network does.
"""
from __future__ import annotations

import asyncio
import contextlib


class DroppingProxy:
    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self.port = 0
        self.drops = 0
        self._server: asyncio.Server | None = None
        self._open: set[asyncio.StreamWriter] = set()

    async def __aenter__(self) -> "DroppingProxy":
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

    async def _serve(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        try:
            upstream_r, upstream_w = await asyncio.open_connection("127.0.0.1", self.upstream_port)
        except OSError:
            client_w.transport.abort()
            return
        pair = {client_w, upstream_w}
        self._open |= pair
        try:
            await asyncio.gather(_pipe(client_r, upstream_w), _pipe(upstream_r, client_w))
        finally:
            self._open -= pair
            for w in pair:
                w.transport.abort()


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    with contextlib.suppress(ConnectionError, OSError):
        while chunk := await reader.read(65536):
            writer.write(chunk)
            await writer.drain()
    with contextlib.suppress(Exception):
        writer.transport.abort()
