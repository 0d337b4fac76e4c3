"""One real gateway, built as `parley gateway` builds it (uvicorn; real Kafka, Cassandra, Redis), in a
thread of the test process, on a free port.

No stages run behind it: tests that need a decision or token events produce them to the gateway's
topics themselves, as the stages would.
"""
from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import httpx
import uvicorn
from fastapi import FastAPI

from infra.config.settings import Settings
from producers.gateway.cli import build


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def serve(settings: Settings) -> Iterator[str]:
    with serve_app(build(settings)) as url:
        yield url


@contextmanager
def serve_app(app: FastAPI) -> Iterator[str]:
    """``app`` served as ``serve`` does; the test keeps the app (``app.state.gateway``) to look inside."""
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port,
                                           log_level="warning", lifespan="on"))
    thread = threading.Thread(target=server.run, name="gateway", daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/healthz", timeout=2).status_code == 200:
                break
        except httpx.HTTPError:
            time.sleep(0.2)
    else:
        raise RuntimeError("the gateway did not answer /healthz within 60 s")
    try:
        yield url
    finally:
        server.should_exit = True
        thread.join(timeout=30)
