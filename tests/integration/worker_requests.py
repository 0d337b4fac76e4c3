"""What the worker tests on real Kafka share: put one generation's request on the paid lane, and gather that
generation's events from a reader of chat.tokens."""
from __future__ import annotations

import uuid
from typing import Any

from schemas import GenerationRequested, decode
from topics import Topics
from topics.clients import send


async def request(producer: Any, topics: Topics, generation_id: str, max_tokens: int) -> None:
    await send(producer, topics.generate("large", "paid"), GenerationRequested(
        generation_id=generation_id, conversation_id=f"c-{generation_id}", user_id=f"u-{uuid.uuid4().hex}",
        plan="paid", pool="large", lane="paid", prompt_token_ids=list(range(12)), max_tokens=max_tokens,
        message_id=generation_id), key=f"c-{generation_id}")


async def gather_events(reader: Any, generation_id: str, events: list[Any], timeout_ms: int = 200) -> None:
    """Append to ``events`` what one fetch brings of ``generation_id``'s events."""
    for records in (await reader.getmany(timeout_ms=timeout_ms)).values():
        events += [e for r in records if getattr(e := decode(r.value), "generation_id", None) == generation_id]
