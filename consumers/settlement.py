"""Settlement (``settlement``): ``GenerationFinished`` on ``chat.replies`` ->
``UsageRecorded`` on ``usage`` (keyed by user).

Charges the real tokens, gives back the unused reservation and frees the running
slot (``Quota.settle``, one Lua script, exactly once per generation). The settled
marker doubles as an outbox: it holds every UsageRecorded field and a
``published`` flag set only after Kafka acknowledged the record. So:

- a redelivered reply (or a restart before the offset commit) settles nothing
  again, but publishes the record if the earlier attempt died before the ack;
- a crash between the ack and the flag re-sends the same record once; the usage
  rollup and billing dedupe by generation_id.

Redis unreachable is waited out by the stage loop's one retry policy (``until_stored`` around ``handle``):
``handle`` is tried again from its first step, which is exactly a redelivery's path.
"""
from __future__ import annotations

import logging

from consumers.stage import Out, Stage
from infra.config.settings import Settings
from infra.stores import keys
from infra.stores.quota import Quota
from infra.stores.quota_outcomes import Settled
from infra.stores.settling import Send, charge_for, publish_usage
from schemas import GenerationFinished, UsageRecorded
from topics import Role, Topics, clients
from topics.catalogue import DEADLETTER, REPLIES, SETTLEMENT, USAGE

log = logging.getLogger(__name__)
ROLE = Role(SETTLEMENT, reads=(REPLIES,), writes=(USAGE, DEADLETTER))


class Settlement:
    def __init__(self, quota: Quota, send: Send) -> None:
        self.quota, self.send = quota, send

    async def handle(self, finished: GenerationFinished) -> Settled | None:
        """Settle one reply; the marker whose usage this call published, or None if there was nothing to do.
        A store error propagates: the caller retries the whole call (``until_stored``), which is safe because
        every step is idempotent (a second settle finds the marker, a published marker is not sent again)."""
        if finished.purpose != "reply":
            return None  # titles and summaries are the service's own calls, never reserved
        if await self._stale(finished):
            return None  # a fenced-off worker's late finish: the new owner's finish settles it, with all its tokens
        # 1. Charge the real tokens and free the reservation, once (the Lua script's marker).
        marker = await self._settle(finished)
        # 2. A redelivery: already settled; publish only if that attempt never reached Kafka.
        if marker is None:
            marker = await self.quota.settled(finished.generation_id)
            if marker is None:
                log.warning("generation %s has no reservation and no settlement (never reserved, or settled "
                            "more than the marker's lifetime ago)", finished.generation_id)
                return None
            if marker.published:
                log.info("generation %s already settled and recorded; duplicate skipped", finished.generation_id)
                return None
        await publish_usage(self.quota, self.send, marker)
        return marker

    async def _stale(self, finished: GenerationFinished) -> bool:
        """Whether a newer owner (fencing epoch) took this generation over after the worker that finished it."""
        if finished.epoch <= 0:
            return False
        current = await self.quota.redis.get(keys.generation_epoch(finished.generation_id))
        if current is None or finished.epoch >= int(current):
            return False
        log.warning("generation %s: finish of owner epoch %d not settled (epoch %s owns it)",
                    finished.generation_id, finished.epoch, current.decode())
        return True

    async def _settle(self, finished: GenerationFinished) -> Settled | None:
        tokens_in, tokens_out = charge_for(finished)
        return await self.quota.settle(
            finished.generation_id, tokens_in, tokens_out,
            tokens_cached=finished.usage.cached_prompt_tokens if tokens_in else 0, status=finished.status,
            model=finished.model, pool=finished.pool, started_at=finished.started_at, finished_at=finished.at,
            block_category=finished.block.category if finished.block else "",
            rules_version=finished.block.rules_version if finished.block else "")


def build_stage(settings: Settings, quota: Quota) -> Stage:
    """The settlement stage over ``chat.replies`` (keyed by conversation): replies of different conversations
    are settled at once, each conversation's in order. Each reply's usage is sent on the stage's own producer
    and its ack awaited before the marker is flagged published (the outbox's order); the offset is committed
    once the batch is settled. Run it with ``await stage.run()``, stop it with ``stage.stop()``."""
    topics = Topics(settings.topic_prefix)

    async def send(record: UsageRecorded) -> None:
        await clients.send(stage.producer, topics.usage, record, key=record.user_id)

    settlement = Settlement(quota, send)

    async def handle(finished: GenerationFinished) -> list[Out]:
        await settlement.handle(finished)
        return []

    stage = Stage(ROLE, settings, (GenerationFinished,), handle, per_key=True)
    return stage
