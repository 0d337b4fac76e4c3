"""Work past its deadline is dropped: the gateway already answered the client 503 (no decision in time,
or Kafka too slow to acknowledge), so running it would generate and bill a reply nobody waits for.

The deadline is set by the gateway on ``MessageSubmitted`` and carried by ``RequestAdmitted`` and
``PromptBuilt``; once a request is queued the client has its stream and the deadline no longer applies.
A stage restarted after a crash is handed its uncommitted records again, by then past their deadlines:
those whose generation was queued already (``keys.generation_queued``) are not late work, and dropping
them ended a reply that was streaming or done as ``failed`` and released what it was charged.
"""
from __future__ import annotations

import time
from typing import Any

from infra.stores import keys

QUEUED_MARK_TTL_S = 3600  # far past any redelivery after a restart


def past_deadline(deadline: float, now: float | None = None) -> bool:
    return deadline > 0 and (time.time() if now is None else now) > deadline


async def late(deadline: float, generation_id: str, redis: Any) -> bool:
    """Past its deadline and never queued: work to drop (the client was answered 503)."""
    if not past_deadline(deadline):
        return False
    return redis is None or not await redis.exists(keys.generation_queued(generation_id))


async def mark_queued(redis: Any, generation_id: str) -> None:
    if redis is not None:
        await redis.set(keys.generation_queued(generation_id), 1, ex=QUEUED_MARK_TTL_S)
