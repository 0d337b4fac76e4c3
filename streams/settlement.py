"""Settlement (faust app ``settlement``): ``GenerationFinished`` on ``chat.replies`` ->
``UsageRecorded`` on ``usage`` (keyed by user).

Charges the real tokens, gives back the unused reservation and frees the running
slot (``Quota.settle``, one Lua script, exactly once per generation). The settled
marker doubles as an outbox: it holds every UsageRecorded field and a
``published`` flag set only after Kafka acknowledged the record. So:

- a redelivered reply (or a restart before the offset commit) settles nothing
  again, but publishes the record if the earlier attempt died before the ack;
- a crash between the ack and the flag re-sends the same record once; the usage
  rollup and billing dedupe by generation_id.

Redis unreachable is waited out by the agent's one retry policy (``applied``, which runs ``handle`` under
``until_stored``): ``handle`` is tried again from its first step, which is exactly a redelivery's path.
"""
from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

import faust

from infra.config.settings import Settings
from infra.stores import keys
from infra.stores.quota import Quota
from infra.stores.quota_outcomes import Settled
from schemas import GenerationFinished, UsageRecorded
from streams.app import applied, make_app, topic
from topics import Role, Topics
from topics.catalogue import DEADLETTER, REPLIES, SETTLEMENT, USAGE

log = logging.getLogger(__name__)
ROLE = Role(SETTLEMENT, reads=(REPLIES,), writes=(USAGE, DEADLETTER))

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


def faust_sender(usage: faust.TopicT) -> Send:
    async def send(record: UsageRecorded) -> None:
        # force=True: publish now and wait for the ack (faust would otherwise defer the
        # send to the source offset's commit, after the marker was already flagged).
        pending = await usage.send(key=record.user_id.encode(), value=record, force=True)
        await pending

    return send


def build_app(settings: Settings, quota: Quota) -> faust.App:
    """The settlement faust app; start it with ``await app.start()`` (or wrap it in a ``FaustStage``)."""
    app = make_app(ROLE.stage, settings)
    topics = Topics(settings.topic_prefix)
    settlement = Settlement(quota, faust_sender(topic(app, topics, USAGE)))

    @app.agent(topic(app, topics, REPLIES))
    async def settle(stream: faust.StreamT) -> None:
        async for finished in stream:
            if isinstance(finished, GenerationFinished):
                await applied(ROLE.stage, stream, topics, settlement.handle, finished)

    return app
