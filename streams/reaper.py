"""The reservation reaper: no budget stays locked when a reply's settlement never comes.

Every ``interval_s`` it takes the reservations past their expiry (5 minutes by
default), replays ``chat.replies`` (the usage log) from the oldest one's start and
settles each with the real numbers if its ``GenerationFinished`` is there. If it
is not, the log shows nothing produced (a gateway or worker died before any reply
ended): it releases the whole reservation and charges 0, never an estimate.
Then it publishes any settled-but-unpublished usage left by a crashed settlement.

``Quota.settle`` is exactly-once, so the reaper and settlement may race on one
generation: whichever comes second changes nothing. A reply that finishes after
its reservation was released is therefore not charged (under-charge, never double).
"""
from __future__ import annotations

import logging
import time
from typing import Any

from aiokafka.errors import KafkaError

from infra.config.settings import Settings
from infra.stores.quota import Quota
from infra.stores.quota_outcomes import Reservation, Settled
from infra.stores.retry import HEALTH, MAX_DELAY_S, STORE_DOWN, dependency_of
from infra.stores.settling import charge_for, publish_usage
from schemas import GenerationFinished, UsageRecorded
from topics import Role, Topics
from topics.catalogue import REAPER, REPLIES, USAGE
from topics.clients import make_producer, send
from topics.replay import replay
from topics.runner import Runner

log = logging.getLogger(__name__)
ROLE = Role(REAPER, reads=(REPLIES,), writes=(USAGE,))  # replays chat.replies without a group


class Reaper(Runner):
    name = ROLE.stage

    def __init__(self, settings: Settings, quota: Quota, *, interval_s: float = 30.0, outbox_grace_s: float = 30.0,
                 replay_margin_s: float = 60.0) -> None:
        """``outbox_grace_s``: how long settlement gets to publish its own record before the reaper does."""
        super().__init__()
        self.settings, self.quota, self.topics = settings, quota, Topics(settings.topic_prefix)
        self.interval_s, self.outbox_grace_s, self.replay_margin_s = interval_s, outbox_grace_s, replay_margin_s
        self.producer = make_producer(settings.kafka_bootstrap)

    def clients(self) -> list[Any]:
        return [self.producer]

    async def step(self) -> None:
        try:
            await self.sweep()
        except (*STORE_DOWN, KafkaError) as exc:
            # Nothing is lost by skipping a pass (the expiry set and the usage log keep everything): the reaper
            # stays up, says so, and sweeps again within 5 s, then at its usual pace once a sweep succeeds.
            dependency = "Kafka" if isinstance(exc, KafkaError) else dependency_of(exc)
            HEALTH.down(self.name, dependency)
            log.warning("reaper sweep failed: %s unreachable (%s); next sweep in %.0f s", dependency,
                        type(exc).__name__, min(self.interval_s, MAX_DELAY_S))
            await self.idle(min(self.interval_s, MAX_DELAY_S))
            return
        HEALTH.up(self.name)
        await self.idle(self.interval_s)

    def reset(self) -> None:
        self.producer = make_producer(self.settings.kafka_bootstrap)

    async def sweep(self, now: float | None = None) -> list[Settled]:
        """One pass; the generations this pass settled or published."""
        now = time.time() if now is None else now
        done = await self._reap(now)
        for marker in await self.quota.unpublished(self.outbox_grace_s, now):
            log.info("generation %s settled but unpublished for %.0f s; publishing", marker.generation_id,
                     now - marker.settled_at)
            await publish_usage(self.quota, self._send, marker)
            done.append(marker)
        return done

    async def _reap(self, now: float) -> list[Settled]:
        # 1. Expired reservations still present (the settled ones left the expiry set atomically).
        expired = []
        for generation_id in await self.quota.expired(now):
            reservation = await self.quota.reservation(generation_id)
            if reservation is None:
                await self.quota.forget_expired(generation_id)
            else:
                expired.append(reservation)
        if not expired:
            return []
        # 2. One replay of the usage log covers them all.
        wanted = {r.generation_id for r in expired}
        since = min(r.created_at for r in expired) - self.replay_margin_s
        finished: dict[str, GenerationFinished] = {}
        async for event in replay(self.settings.kafka_bootstrap, self.topics.replies, since, (GenerationFinished,)):
            if isinstance(event, GenerationFinished) and event.generation_id in wanted:
                finished[event.generation_id] = event
        # 3. Settle each with what really happened; publish at once.
        done = []
        for reservation in expired:
            marker = await self._settle(reservation, finished.get(reservation.generation_id))
            if marker is not None:
                await publish_usage(self.quota, self._send, marker)
                done.append(marker)
        return done

    async def _settle(self, r: Reservation, reply: GenerationFinished | None) -> Settled | None:
        if reply is not None:
            tokens_in, tokens_out = charge_for(reply)
            log.info("generation %s reservation expired; settling from its reply (%s): in %d, out %d",
                     r.generation_id, reply.status, tokens_in, tokens_out)
            return await self.quota.settle(
                r.generation_id, tokens_in, tokens_out,
                tokens_cached=reply.usage.cached_prompt_tokens if tokens_in else 0, status=reply.status,
                model=reply.model, pool=reply.pool, started_at=reply.started_at, finished_at=reply.at)
        released = await self.quota.release(r.generation_id, "expired")
        log.warning("generation %s user %s reservation expired with no finished reply in the log (gateway or "
                    "worker lost it); released %s of %d reserved tokens, charged 0", r.generation_id, r.user_id,
                    released, r.amount)
        return None  # nothing charged, so nothing for the usage topic

    async def _send(self, record: UsageRecorded) -> None:
        await send(self.producer, self.topics.usage, record, key=record.user_id)
