"""Queue per plan (group ``scheduler``): ``PromptBuilt`` on ``chat.prompts`` ->
``GenerationRequested`` on ``generate.<pool>.<lane>`` and ``GenerationQueued`` on ``chat.tokens``
(or ``RequestRefused`` when every pool is past the plan's wait limit).

Follows ``chat.replies`` to learn each pool's pace (``estimate``): how long a reply holds a worker's slot and
how long its first token takes. Tells a queued client its position and wait once, and again only when that
wait, counted down, is no longer true (``GenerationQueued`` with a higher ``revision``: at most one record per
waiting request per REVISE_GAP_S, none while the first one holds). Picks the partition (the replica) by
Places each generation on a replica (a worker) by its pool's ``routing`` (``placement``, ``replicas``): the workers
announce in Redis which partitions they own; the generation goes to a partition its replica owns. Until a
worker of the pool has announced, a partition by consistent hashing on the conversation, unless that
partition's queue is much longer than the others'.
"""
from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import Coroutine
from typing import Any

import msgspec
from aiokafka.errors import KafkaError
from prometheus_client import Counter as PromCounter
from redis.exceptions import RedisError

from consumers.deadlines import late, mark_queued
from consumers.generation.announce import ReplicaAnnounced
from consumers.scheduler.canned import CANNED_MODEL, CANNED_POOL, CannedReplies
from consumers.scheduler.estimate import Completion
from consumers.scheduler.queueing import PoolLoad, Queues, Refuse, Route
from consumers.scheduler.replicas import Replicas
from consumers.stage import Out, Stage
from infra.config.plans import Plan
from infra.config.settings import Settings
from infra.stores import keys
from infra.stores.crypto import KeyGone
from infra.stores.finished import FinishedReplies
from infra.stores.quota import Quota
from infra.stores.sealing import Sealer
from schemas import (
    GenerationFinished,
    GenerationQueued,
    GenerationRequested,
    PromptBuilt,
    RequestRefused,
    Usage,
    decode,
)
from schemas.errors import EventDecodeError
from schemas.prompt import PoolPrompt
from schemas.scheduler import LANE_PRIORITY
from topics import GENERATE, Role, Topics
from topics.catalogue import DEADLETTER, GENERATION, PROMPTS, REPLIES, SCHEDULER, TOKENS
from topics.clients import STEADY_FETCH_WAIT_MS, enqueue, make_consumer
from topics.partitioning import partition_for

log = logging.getLogger(__name__)
# The fallback rate's numerator (overflow, canned, refused) and denominator (every outcome), by plan and the
# pool the request asked for.
DECISIONS = PromCounter("parley_scheduler_decisions",
                        "each request's route: routed, overflow (to small), canned (a prepared reply) or refused",
                        ["plan", "pool", "outcome"])
PLACEMENTS = PromCounter("parley_scheduler_placements",
                         "generations placed by replica: home, spill (past the load cap), cache (the replica "
                         "holding the prompt), random, or partition (no replica announced yet)", ["pool", "reason"])
REVISE_EVERY_S = 1.0  # how often waiting requests' shown waits are checked (no record unless one is off)
REPLICAS_EVERY_S = 0.5  # how often the workers' announcements are read (they beat every second)
HOT_REPLICA_MARGIN = 4  # before any replica announced: requests over the coolest partition before affinity yields
# Reads chat.replies without a group (every scheduler hears every completion); writes a finished reply itself
# when it serves a prepared one.
ROLE = Role(SCHEDULER, reads=(PROMPTS, REPLIES), writes=(GENERATE, TOKENS, REPLIES, DEADLETTER))


class Scheduler:
    def __init__(self, topics: Topics, queues: Queues, plans: dict[str, Plan], models: dict[str, str],
                 canned: CannedReplies | None = None, quota: Any = None, finished: Any = None,
                 redis: Any = None, replicas: dict[str, Replicas] | None = None) -> None:
        self.topics, self.queues, self.plans, self.models = topics, queues, plans, models
        self.replicas = replicas or {}  # pool -> its replicas as announced (none: a partition by hashing)
        self.canned, self.quota, self.replies = canned, quota, finished  # not .finished: a method
        self.redis = redis  # the queued marks (None: every late record is dropped)
        self.partition_load: dict[str, Counter[int]] = {}
        self.placed: dict[str, tuple[str, int]] = {}
        self.queued: dict[str, GenerationQueued] = {}  # what each waiting client was told, to revise it

    async def handle(self, p: PromptBuilt) -> list[Out]:
        if await late(p.deadline, p.generation_id, self.redis):
            return self._expired(p)
        plan = self.plans[p.plan]
        if p.pool not in self.queues.pools:
            return await self._refuse(p, 422, f"Unknown model pool {p.pool!r}. Choose one of: "
                                               f"{', '.join(sorted(self.queues.pools))}.", None)
        overflow = self.queues.overflow_pool
        down = [pool for pool, replicas in self.replicas.items() if replicas.down]
        decision = self.queues.route(p.pool, plan.lane, plan.queue_wait_limit_s, p.route_reason,
                                     can_overflow=any(a.pool == overflow for a in alternates_of(p)), down=down)
        if isinstance(decision, Refuse):
            return await self._past_limit(p, plan, decision)
        return await self._queue(p, decision)

    async def _past_limit(self, p: PromptBuilt, plan: Plan, decision: Refuse) -> list[Out]:
        """Every pool is past the plan's wait limit (or has no replica): a prepared reply when one fits, else a
        refusal."""
        prepared = self.canned.reply_for(p.question) if self.canned else None
        if prepared is not None:
            DECISIONS.labels(plan=p.plan, pool=p.pool, outcome="canned").inc()
            log.info("generation %s served a prepared reply: every pool past the %s limit", p.generation_id,
                     p.plan)
            await mark_queued(self.redis, p.generation_id)
            return await self._prepared(p, prepared)
        DECISIONS.labels(plan=p.plan, pool=p.pool, outcome="refused").inc()
        if decision.down:
            log.info("generation %s refused: no replica of %s announced", p.generation_id, p.pool)
        else:
            log.info("generation %s refused: wait %.1f s over %s limit", p.generation_id, decision.wait_s, p.plan)
        return await self._refuse(p, 503, decision.message, max(1.0, decision.wait_s - plan.queue_wait_limit_s))

    async def _queue(self, p: PromptBuilt, decision: Route) -> list[Out]:
        """The request on a replica's partition of its pool and lane, and its client told its place."""
        ids, max_tokens = prompt_for(p, decision.pool)
        await mark_queued(self.redis, p.generation_id)  # before the records: a redelivery is never "late"
        topic = self.topics.generate(decision.pool, decision.lane)
        partition = self._place(topic, decision.pool, p.generation_id, p.conversation_id, ids)
        self.queues.enqueued(p.generation_id, decision.pool, decision.lane)
        self.placed[p.generation_id] = (topic, partition)
        self.partition_load.setdefault(topic, Counter())[partition] += 1
        outcome = "overflow" if decision.reason == "overflow" else "routed"
        DECISIONS.labels(plan=p.plan, pool=p.pool, outcome=outcome).inc()
        log.info("generation %s -> %s[%d] position %d wait %.1fs (%s)", p.generation_id, topic, partition,
                 decision.position, decision.wait_s, decision.reason,
                 extra={"generation_id": p.generation_id, "plan": p.plan, "pool": decision.pool, "lane": decision.lane})
        route_reason = decision.reason if decision.reason == "overflow" else p.route_reason
        queued = GenerationQueued(
            generation_id=p.generation_id, conversation_id=p.conversation_id, user_id=p.user_id,
            pool=decision.pool, model=self.models[decision.pool], lane=decision.lane,
            position=decision.position, estimated_wait_s=round(decision.wait_s, 1), message_id=p.assistant_message_id,
            route_reason=route_reason, requested_pool=p.pool)
        if decision.position > 0:
            self.queued[p.generation_id] = queued
            self.queues.shown(p.generation_id, decision.wait_s)
            pace = self.queues.pools[decision.pool].pace(time.time())
            log.info("generation %s wait from: service %.2f s, first token %.2f s, %d sequences, ends in %s s",
                     p.generation_id, pace.service_s, pace.prefill_s, pace.seqs,
                     ",".join(f"{e:.1f}" for e in pace.ends))
        return [
            Out(self.topics.tokens, queued, p.generation_id),
            Out(topic, GenerationRequested(
                generation_id=p.generation_id, conversation_id=p.conversation_id, user_id=p.user_id,
                plan=p.plan, pool=decision.pool, lane=decision.lane,
                prompt_token_ids=ids, max_tokens=max_tokens,
                priority=LANE_PRIORITY[decision.lane],
                message_id=p.assistant_message_id, turn=p.turn,
                parent_id=p.user_message_id, reserved_tokens=p.reserved_tokens,
                route_reason=route_reason, enqueued_at=time.time(), sampling=p.sampling, question=p.question,
                made_listed=p.made_listed, made_unlisted=p.made_unlisted,
                **_temperature(p)),
                p.conversation_id, partition),
        ]

    async def _prepared(self, p: PromptBuilt, text: str) -> list[Out]:
        """The last-resort tier: start and finish at once, saying plainly that no model answered."""
        queued = GenerationQueued(generation_id=p.generation_id, conversation_id=p.conversation_id,
                                  user_id=p.user_id, pool=CANNED_POOL, model=CANNED_MODEL, lane="free", position=0,
                                  estimated_wait_s=0.0, message_id=p.assistant_message_id,
                                  route_reason="canned", requested_pool=p.pool)
        done = GenerationFinished(
            generation_id=p.generation_id, conversation_id=p.conversation_id, user_id=p.user_id, plan=p.plan,
            message_id=p.assistant_message_id, turn=p.turn, parent_id=p.user_message_id, status="complete",
            text=text, usage=Usage(prompt_tokens=0, completion_tokens=0), model=CANNED_MODEL, pool=CANNED_POOL,
            worker_id="scheduler", reserved_tokens=p.reserved_tokens, route_reason="canned")
        if self.replies is not None:
            await self.replies.put(done)  # readable before its end is published, like a worker's reply
        return [Out(self.topics.tokens, queued, p.generation_id), Out(self.topics.tokens, done, p.generation_id),
                Out(self.topics.replies, done, p.conversation_id)]

    def _expired(self, p: PromptBuilt) -> list[Out]:
        """Past its deadline (the client was answered 503): never queued. The saved placeholder ends as
        ``failed`` and settlement releases the reservation, charging 0 tokens."""
        log.info("generation %s dropped before queueing: past its deadline by %.1f s; 0 tokens charged",
                 p.generation_id, time.time() - p.deadline)
        done = GenerationFinished(
            generation_id=p.generation_id, conversation_id=p.conversation_id, user_id=p.user_id, plan=p.plan,
            message_id=p.assistant_message_id, turn=p.turn, parent_id=p.user_message_id, status="failed",
            text="", usage=Usage(prompt_tokens=0, completion_tokens=0), model=self.models.get(p.pool, ""),
            pool=p.pool, worker_id="scheduler", reason="The service did not start this reply in time; "
            "nothing was charged. Send it again.", reserved_tokens=p.reserved_tokens, route_reason=p.route_reason)
        return [Out(self.topics.tokens, done, p.generation_id), Out(self.topics.replies, done, p.conversation_id)]

    def _place(self, topic: str, pool: str, generation_id: str, conversation_id: str, ids: list[int] | str) -> int:
        replicas = self.replicas.get(pool)
        placed = replicas.place(topic, conversation_id, generation_id, ids) if replicas is not None else None
        if placed is None:
            PLACEMENTS.labels(pool=pool, reason="partition").inc()
            return self._partition(topic, conversation_id)
        PLACEMENTS.labels(pool=pool, reason=placed.placement.reason).inc()
        log.debug("generation %s on replica %s (%s, %.0f%% of the prompt held)", generation_id,
                  placed.placement.replica, placed.placement.reason, 100 * placed.placement.held_share)
        return placed.partition

    def _partition(self, topic: str, conversation_id: str) -> int:
        n = GENERATE.partitions
        home = partition_for(conversation_id, n)
        load = self.partition_load.setdefault(topic, Counter())
        coolest = min(range(n), key=lambda i: load[i])
        return coolest if load[home] - load[coolest] > HOT_REPLICA_MARGIN else home

    def finished(self, generation_id: str, completion: Completion | None = None, pool: str | None = None) -> None:
        self.queued.pop(generation_id, None)
        self.queues.finished(generation_id, completion, pool)
        placed = self.placed.pop(generation_id, None)
        if placed:
            self.partition_load[placed[0]][placed[1]] -= 1
        for replicas in self.replicas.values():
            replicas.finished(generation_id)

    def revisions(self, now: float | None = None) -> list[Out]:
        """A new ``queued`` event for each waiting client whose shown wait, counted down, is no longer true."""
        outs = []
        for generation_id, position, wait in self.queues.revised(now):
            told = self.queued.get(generation_id)
            if told is None:
                continue
            told = msgspec.structs.replace(told, position=position, estimated_wait_s=round(wait, 1),
                                           revision=told.revision + 1, at=time.time() if now is None else now)
            self.queued[generation_id] = told
            outs.append(Out(self.topics.tokens, told, generation_id))
        return outs

    async def _refuse(self, p: PromptBuilt, status: int, message: str, retry_after: float | None) -> list[Out]:
        """Refuse after the prompt build saved the user message: the reservation and the running slot go
        back first (nothing charged), and the ``generating`` placeholder is ended as ``failed`` through the
        replies topic, so persistence closes it and settlement finds nothing left to settle."""
        if self.quota is not None:
            await self.quota.release(p.generation_id, "scheduler")
        failed = GenerationFinished(
            generation_id=p.generation_id, conversation_id=p.conversation_id, user_id=p.user_id, plan=p.plan,
            message_id=p.assistant_message_id, turn=p.turn, parent_id=p.user_message_id, status="failed",
            text="", usage=Usage(), model="", pool=p.pool, worker_id="scheduler", reason=message,
            reserved_tokens=p.reserved_tokens, route_reason=p.route_reason)
        refused = RequestRefused(
            generation_id=p.generation_id, conversation_id=p.conversation_id, user_id=p.user_id,
            reason="overloaded" if status == 503 else "invalid", message=message, status=status,
            retry_after_s=retry_after)
        if self.replies is not None:
            await self.replies.put(failed)
        return [Out(self.topics.tokens, refused, p.generation_id), Out(self.topics.replies, failed, p.conversation_id)]


class SchedulerStage(Stage):
    """The scheduler's stage plus its follower of ``chat.replies`` (completions feed the service rate)."""

    def __init__(self, settings: Settings, plans: dict[str, Plan], pools: dict[str, Any], redis: Any = None,
                 sealer: Sealer | None = None) -> None:
        topics = Topics(settings.topic_prefix)
        queues = Queues({name: PoolLoad.of(cfg.max_num_seqs, cfg.held_requests) for name, cfg in pools.items()})
        quota = Quota.configured(redis, plans, settings) if redis is not None else None
        # The load cap never under a quarter of a replica's batch: below it, a spill costs a cache and saves nothing.
        replicas = {n: Replicas(c.routing, c.sim.block_size, floor=max(1, c.max_num_seqs // 4))
                    for n, c in pools.items()} if redis is not None else {}
        self.scheduler = Scheduler(topics, queues, plans, {n: c.served_model_name for n, c in pools.items()},
                                   CannedReplies.load(settings.canned_file), quota,
                                   FinishedReplies(redis, sealer=sealer) if redis is not None else None, redis,
                                   replicas)
        self.groups = {n: topics.group(GENERATION, n) for n in replicas}
        super().__init__(ROLE, settings, (PromptBuilt,), self.scheduler.handle, sealer=sealer)

    def background(self) -> list[Coroutine[Any, Any, None]]:
        return [self._follow_replies(), self._revise(), *([self._follow_replicas()] if self.groups else [])]

    async def _follow_replicas(self) -> None:
        """Every REPLICAS_EVERY_S: each pool's announced replicas (a read of one set and its keys per pool)."""
        while not self.stopping:
            for pool, group in self.groups.items():
                try:
                    self.scheduler.replicas[pool].update(await read_announcements(self.scheduler.redis, group))
                except RedisError as exc:
                    log.info("replicas of %s not read this round: %s", pool, type(exc).__name__)
            await self.idle(REPLICAS_EVERY_S)

    async def _revise(self) -> None:
        """Every REVISE_EVERY_S: the revised waits, their acks awaited once per round and their errors let go
        (a lost one is superseded by the next revision; the client counts down the last it got meanwhile)."""
        while not self.stopping:
            await self.idle(REVISE_EVERY_S)
            acks = []
            for out in self.scheduler.revisions():
                try:
                    sealed = await self._sealed([out])
                    acks += [await enqueue(self.producer, o.topic, o.event, o.key, o.partition) for o in sealed]
                except KeyGone:
                    continue  # the conversation was deleted meanwhile: nobody left to tell
                except KafkaError as exc:
                    log.info("revised waits not sent this round: %s", type(exc).__name__)
                    break
            await asyncio.gather(*acks, return_exceptions=True)

    async def _follow_replies(self) -> None:
        consumer = make_consumer(self.settings.kafka_bootstrap, self.topics.replies, group_id=None,
                                 auto_offset_reset="latest", fetch_max_wait_ms=STEADY_FETCH_WAIT_MS)
        await consumer.start()
        try:
            async for record in consumer:
                try:
                    event = decode(record.value, (GenerationFinished,))
                except EventDecodeError:
                    continue  # the persistence stage dead-letters it
                if isinstance(event, GenerationFinished):
                    self.scheduler.finished(event.generation_id, completion_of(event), event.pool)
        finally:
            await consumer.stop()


async def read_announcements(redis: Any, group: str) -> list[ReplicaAnnounced]:
    """The live announcements of a pool's workers; members whose key expired are dropped from the set."""
    members = sorted(m.decode() if isinstance(m, bytes) else m for m in await redis.smembers(keys.replicas(group)))
    if not members:
        return []
    values = await redis.mget([keys.replica(group, m) for m in members])
    gone = [m for m, v in zip(members, values, strict=True) if v is None]
    if gone:
        await redis.srem(keys.replicas(group), *gone)
    return [msgspec.json.decode(v, type=ReplicaAnnounced) for v in values if v is not None]


def completion_of(event: GenerationFinished, now: float | None = None) -> Completion:
    """A reply's times in its worker (taken -> first token, taken -> ended), from the worker's own clock."""
    taken = event.started_at
    return Completion(at=time.time() if now is None else now,
                      held_s=max(event.at - taken, 0.0) if taken > 0 else 0.0,
                      first_token_s=max(event.first_token_at - taken, 0.0) if taken > 0 < event.first_token_at else 0.0)


def alternates_of(p: PromptBuilt) -> list[PoolPrompt]:
    """The other pools' prompts of an opened event (the stage loop opens what arrives sealed)."""
    if isinstance(p.alternates, str):
        raise ValueError(f"generation {p.generation_id}: alternates still sealed")
    return p.alternates


def prompt_for(p: PromptBuilt, pool: str) -> tuple[list[int] | str, int]:
    """The token ids and reply cap fitted for ``pool``: the main prompt, or the alternate made for it."""
    alternate = next((a for a in alternates_of(p) if a.pool == pool), None) if pool != p.pool else None
    if alternate is None:
        return p.prompt_token_ids, p.max_tokens
    return alternate.prompt_token_ids or p.prompt_token_ids, alternate.max_tokens


def _temperature(p: PromptBuilt) -> dict[str, Any]:
    """The request's own temperature, or nothing (the event's default) when it named none."""
    return {} if p.temperature is None else {"temperature": p.temperature}
