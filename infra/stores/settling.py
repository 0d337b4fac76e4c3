"""What a finished reply is charged, and how a settled reply's usage is published (the outbox's order):
shared by settlement, the reaper and the billing audit."""
from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

from infra.stores.quota import Quota
from infra.stores.quota_outcomes import Settled
from schemas import GenerationFinished, UsageRecorded

log = logging.getLogger(__name__)

Send = Callable[[UsageRecorded], Awaitable[None]]


def charge_for(finished: GenerationFinished) -> tuple[int, int]:
    """(tokens in, tokens out) to charge: what the engine read and wrote for the reply, whatever its end. A
    reply that failed before any engine read it (refused, past its deadline, a pool with no room) reports no
    usage and costs 0; one that failed in the engine (a grammar that did not compile or timed out, an engine
    error) cost engine time and is charged at least its prompt: otherwise it could be repeated for free."""
    return finished.usage.prompt_tokens, finished.usage.completion_tokens


async def publish_usage(quota: Quota, send: Send, marker: Settled) -> None:
    """Send the marker's UsageRecorded, wait for the ack, then flag it published."""
    await send(marker.usage_recorded())
    await quota.mark_published(marker.generation_id)
    log.info("generation %s user %s usage recorded: day %s, in %d, out %d, charged %d of %d reserved (%s)",
             marker.generation_id, marker.user_id, marker.day, marker.tokens_in, marker.tokens_out, marker.charged,
             marker.reserved, marker.status)
