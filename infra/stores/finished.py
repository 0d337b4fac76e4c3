"""Read-your-writes for replies: the ended reply is in Redis before anyone can see its end.

The worker (or the scheduler, for a prepared reply) stores each ``GenerationFinished`` of
a reply here *before* it publishes the event, so by the time a client has seen
``message_end`` the reply is readable. History reads and the prompt build overlay it on
a message that Cassandra still shows as ``generating`` (persistence saves it a few ms
later); once saved, the row wins and the copy here just expires.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any

import msgspec

from infra.stores import keys
from infra.stores.conversations import Message
from schemas import GenerationFinished, decode, encode

KEEP_S = 15 * 60  # far longer than persistence takes; past it the saved row is the only copy


def overlay(messages: Iterable[Message], finished: dict[str, GenerationFinished]) -> list[Message]:
    """Pure: each ``generating`` assistant row whose reply has ended, shown as it will be saved."""
    out = []
    for m in messages:
        e = finished.get(m.generation_id or "") if m.role == "assistant" and m.status == "generating" else None
        out.append(m if e is None else dataclasses.replace(
            m, content=e.text, status=e.status, tokens_in=e.usage.prompt_tokens,
            tokens_out=e.usage.completion_tokens, tokens_cached=e.usage.cached_prompt_tokens, model=e.model,
            pool=e.pool, finished_at=datetime.fromtimestamp(e.at, UTC), route_reason=e.route_reason,
            block_category=e.block.category if e.block else None,
            rules_version=e.block.rules_version if e.block else None))
    return out


class FinishedReplies:
    """``sealer``: the stored event's text is sealed like the event on Kafka (erasure holds); reads open it."""

    def __init__(self, redis: Any, keep_s: int = KEEP_S, sealer: Any = None) -> None:
        self.redis, self.keep_s, self.sealer = redis, keep_s, sealer

    async def put(self, event: GenerationFinished) -> None:
        await self.redis.set(keys.finished_reply(event.generation_id), encode(event), ex=self.keep_s)

    async def current(self, messages: list[Message]) -> list[Message]:
        """``messages`` with every ended-but-unsaved reply overlaid (one Redis round trip, none if nothing
        is ``generating``)."""
        pending = [m.generation_id for m in messages
                   if m.role == "assistant" and m.status == "generating" and m.generation_id]
        if not pending:
            return messages
        found = {}
        for gid, raw in zip(pending, await self.redis.mget([keys.finished_reply(g) for g in pending]), strict=True):
            if raw is not None:
                event = decode(raw, (GenerationFinished,))
                if isinstance(event, GenerationFinished):
                    if self.sealer is not None:
                        text = await self.sealer.open_text(event.conversation_id, event.text)
                        event = msgspec.structs.replace(event, text=text or "")
                    found[gid] = event
        return overlay(messages, found) if found else messages
