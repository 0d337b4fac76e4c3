"""Server-Sent Events framing, and the mapping from token-buffer events to the client's events."""
from __future__ import annotations

import time
from typing import Any

import msgspec
import orjson

from schemas import GenerationFinished, GenerationQueued, GenerationRetracted, RequestRefused, TokensAppended

STOP_REASONS = {"complete": "end", "stopped": "stopped", "length": "length", "failed": "error", "blocked": "blocked"}
KEEPALIVE = b": keep-alive\n\n"
# The OpenAI-compatible streams keep an idle connection open with an empty line instead: valid SSE (a blank
# line with no data dispatches nothing), and safe for clients that strip each network read before splitting on
# blank lines. vLLM's own benchmark does; a comment read alone then glued itself to every later event, and a
# reply that waited in the queue long enough for a keep-alive came back with no chunk at all.
BLANK_KEEPALIVE = b"\n"
# A browser's EventSource waits this long before reconnecting with Last-Event-ID (its default is
# about 3 s, longer than the reader timeout allows in tests, and longer than a person wants).
RECONNECT_MS = 1000


def frame(event: str, data: Any, id_: int | None = None, retry_ms: int | None = None) -> bytes:
    head = (f"id: {id_}\n" if id_ is not None else "") + (f"retry: {retry_ms}\n" if retry_ms is not None else "")
    return f"{head}event: {event}\ndata: ".encode() + orjson.dumps(data) + b"\n\n"


def to_sse(offset: int, event: object) -> list[bytes]:
    """The frames for one token-buffer event (none for events the client doesn't see)."""
    if isinstance(event, TokensAppended):
        # An end-of-sequence token has ids but no text: the client has nothing to show.
        if not event.text:
            return []
        data: dict[str, Any] = {"text": event.text}
        if event.logprobs is not None:  # asked for: [token, logprob, [[alternative, logprob], ...]] per token
            data["logprobs"] = msgspec.to_builtins(event.logprobs)
        return [frame("delta", data, offset)]
    if isinstance(event, GenerationQueued):
        # A revision (a newer wait while the request still waits) is a `queued` event alone: the reply started
        # once.
        # The scheduler's decision is the moment a reply is moved to another pool or to a prepared reply: the
        # start says so (route_reason "overflow" or "canned", and the pool asked for), not only the saved reply.
        frames = [] if event.revision else [
            frame("message_start", {"message_id": event.message_id, "generation_id": event.generation_id,
                                    "model": event.model, "pool": event.pool, "route_reason": event.route_reason,
                                    "requested_pool": event.requested_pool or event.pool}, offset, RECONNECT_MS)]
        if event.position > 0:  # the wait left now: a replay after a reload does not start the count again
            left = event.estimated_wait_s - max(0.0, time.time() - event.at)
            frames.append(frame("queued", {"position": event.position,
                                           "estimated_wait_s": round(max(left, 0.0), 1)}, offset))
        return frames
    if isinstance(event, GenerationFinished):
        frames = []
        if event.status == "failed":
            frames.append(frame("error", {"message": event.reason or "The model failed to answer."}, offset))
        frames.append(frame("message_end", {
            "stop_reason": STOP_REASONS[event.status], "model": event.model,
            "usage": {"in": event.usage.prompt_tokens, "out": event.usage.completion_tokens}}, offset))
        return frames
    if isinstance(event, GenerationRetracted):
        # Replace everything shown so far with the notice; no category, no rule: nothing to work around.
        return [frame("retracted", {"notice": event.notice}, offset)]
    if isinstance(event, RequestRefused):
        frames = [frame("error", {"status": event.status, "code": event.reason, "message": event.message,
                                  "retry_after_s": event.retry_after_s}, offset)]
        if event.reason == "blocked":  # refused by the input check after the stream had started
            frames.append(frame("message_end", {"stop_reason": "blocked", "usage": {"in": 0, "out": 0}}, offset))
        return frames
    return []


def is_last(event: object) -> bool:
    return isinstance(event, (GenerationFinished, RequestRefused))
