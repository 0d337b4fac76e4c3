"""The HTTP side of one request: create a conversation, post a message, read its SSE reply to the end.

One shared ``httpx.AsyncClient`` (a connection per stream in flight); the body is read as raw chunks and each
chunk's frames are stamped with the time the chunk arrived, which is cheaper than a line iterator and as exact.
Every event is read, so the gateway delivers the whole reply as a browser would make it.
"""
from __future__ import annotations

import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import httpx
import orjson

from producers.loadgen.record import RequestRecord
from producers.loadgen.workload import Turn


@dataclass(frozen=True)
class Frame:
    received: float
    event: str
    data: Any
    id: int | None = None  # the event's id: the Kafka offset of its record


def parse_frame(raw: bytes, received: float) -> Frame | None:
    """One SSE frame (the bytes between blank lines); None for comments and keep-alives."""
    event, data, id_ = "message", [], None
    for line in raw.decode().split("\n"):
        if not line or line.startswith(":"):
            continue
        name, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if name == "event":
            event = value
        elif name == "data":
            data.append(value)
        elif name == "id":
            id_ = int(value)
    return Frame(received, event, orjson.loads("\n".join(data)), id_) if data else None


async def frames(response: httpx.Response) -> AsyncIterator[Frame]:
    buffer = b""
    async for chunk in response.aiter_raw():
        received = time.time()
        buffer += chunk.replace(b"\r\n", b"\n")
        while b"\n\n" in buffer:
            raw, buffer = buffer.split(b"\n\n", 1)
            frame = parse_frame(raw, received)
            if frame is not None:
                yield frame


class ChatClient:
    def __init__(self, url: str, timeout_s: float, max_tokens: int | None) -> None:
        limits = httpx.Limits(max_connections=None, max_keepalive_connections=64)
        self.http = httpx.AsyncClient(base_url=url.rstrip("/"), limits=limits,
                                      timeout=httpx.Timeout(timeout_s, connect=10.0))
        self.max_tokens = max_tokens

    async def close(self) -> None:
        await self.http.aclose()

    async def conversation(self, token: str) -> str:
        r = await self.http.post("/v1/conversations", headers=_auth(token), json={})
        r.raise_for_status()
        return str(r.json()["conversation_id"])

    async def send(self, turn: Turn, record: RequestRecord) -> None:
        """Post ``turn`` and read its reply into ``record``; never raises for what the service answered."""
        conv = turn.conversation
        body: dict[str, Any] = {"content": turn.content}  # as the page sends it: no retry, so no client_message_id
        if self.max_tokens:
            body["max_tokens"] = self.max_tokens
        try:
            if conv.conversation_id is None:
                conv.conversation_id = await self.conversation(conv.user.token)
            record.sent = time.time()
            async with self.http.stream("POST", f"/v1/conversations/{conv.conversation_id}/messages",
                                        headers=_auth(conv.user.token), json=body) as response:
                record.status = response.status_code
                if response.status_code != 200:
                    await _refused(response, record)
                    return
                async for frame in frames(response):
                    if on_frame(frame, record):
                        break
        except httpx.HTTPStatusError as exc:
            record.status, record.error = exc.response.status_code, "conversation_not_created"
        except (httpx.HTTPError, OSError, ValueError) as exc:
            record.error = type(exc).__name__
        finally:
            record.done = time.time()


def on_frame(frame: Frame, record: RequestRecord) -> bool:
    """Fold one event into the record; True after the last one."""
    data = frame.data
    if frame.event == "delta":
        record.deltas.append(frame.received)
        record.chars += len(data.get("text", ""))
    elif frame.event == "message_start":
        record.generation_id, record.model, record.pool = data["generation_id"], data["model"], data.get("pool", "")
    elif frame.event == "queued" and record.queued_at is None:  # the first wait shown is the one judged;
        record.queued_position, record.shown_wait_s = data["position"], data["estimated_wait_s"]  # revisions
        record.queued_at = frame.received  # after it would flatter the figure
    elif frame.event == "error":
        record.error = str(data.get("code") or "error")
        record.retry_after_s = data.get("retry_after_s")
    elif frame.event == "message_end":
        record.stop_reason = data["stop_reason"]
        record.model = data.get("model") or record.model
        record.tokens_in, record.tokens_out = data["usage"]["in"], data["usage"]["out"]
        return True
    return False


async def _refused(response: httpx.Response, record: RequestRecord) -> None:
    raw = await response.aread()
    try:
        detail = orjson.loads(raw).get("error", {})
    except (orjson.JSONDecodeError, AttributeError):
        detail = {}
    record.error = str(detail.get("code") or f"http_{response.status_code}")
    retry = response.headers.get("retry-after")
    record.retry_after_s = float(retry) if retry else detail.get("retry_after_s")


def _auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}
