"""The pipeline in one declaration: which stages ``parley stages`` runs, in the order a message meets them,
and what each one is built from. Every stage is handed its stores; none reads configuration itself.

    gateway -> chat.requests -> ADMISSION -> chat.admitted -> PROMPT -> chat.prompts -> SCHEDULER
      -> generate.<pool>.<lane> -> (generation workers, `parley worker`) -> chat.tokens / chat.replies
      chat.replies -> PERSISTENCE, SETTLEMENT -> usage -> USAGE_ROLLUP;  REAPER sweeps what settlement missed
      reservations + reader heartbeats (Redis) -> ABANDONED -> chat.control
      gateway, RETENTION -> chat.deletions -> PURGE -> audit.purges
"""
from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import redis.asyncio as aioredis

from consumers import admission, persistence, purge, settlement
from consumers.abandoned import AbandonedDetector
from consumers.prompt import builder
from consumers.prompt.tokenizer import ChatTokenizer, tokenizer_for
from consumers.retention import RetentionSweeper
from consumers.safety.classifier import EmbeddedClassifier
from consumers.scheduler.stage import SchedulerStage
from consumers.stage import Stage
from infra.config.plans import Plan, load_plans
from infra.config.pools import PoolConfig, load_pools
from infra.config.safety import RulesFile
from infra.config.settings import Settings
from infra.local.model import ready_pool
from infra.stores.conversations import Conversations
from infra.stores.quota import Quota
from infra.stores.records import Records
from infra.stores.sealing import Sealer, configured
from infra.stores.search import SearchIndex
from infra.stores.session import AsyncSession, connect
from schemas import InputBlocked, RequestAdmitted
from streams import usage_rollup
from streams.app import FaustStage
from streams.reaper import Reaper
from topics import Topics
from topics.catalogue import (
    ABANDONED,
    ADMISSION,
    PERSISTENCE,
    PROMPT,
    PURGE,
    REAPER,
    RETENTION,
    SCHEDULER,
    SETTLEMENT,
    USAGE_ROLLUP,
)


@dataclass(frozen=True)
class Resources:
    """What the stages of one process share: settings, configuration and store clients."""

    settings: Settings
    plans: dict[str, Plan]
    pools: dict[str, PoolConfig]
    redis: Any
    db: AsyncSession
    quota: Quota
    topics: Topics
    sealer: Sealer  # one data-key cache for every stage of the process

    @property
    def keep_nothing(self) -> frozenset[str]:
        """The no-retention plans."""
        return frozenset(name for name, plan in self.plans.items() if plan.no_retention)

    def tokenizer(self, pool: str) -> ChatTokenizer:
        return tokenizer_for(str(self.pools[pool].model_path))


def admission_stage(r: Resources) -> Stage:
    classifier = EmbeddedClassifier(RulesFile(r.settings.safety_file))  # the input check
    return admission.build_stage(r.settings, r.quota, r.plans, r.pools, classifier=classifier, sealer=r.sealer)


def prompt_stage(r: Resources) -> Stage:
    prompts = builder.PromptBuilder(Conversations(r.db, r.sealer), Records(r.db, r.sealer), r.topics, r.tokenizer,
                                    r.settings.prompt_budget_tokens, lambda pool: r.pools[pool].max_model_len,
                                    quota=r.quota, keep_nothing=r.keep_nothing, redis=r.redis,
                                    same_model=lambda a, b: r.pools[a].model_path == r.pools[b].model_path,
                                    honours=lambda pool, tool_call: r.pools[pool].honours(tool_call))
    # Keyed by conversation: turns of one conversation are placed in order; other conversations concurrently.
    return Stage(builder.ROLE, r.settings, (RequestAdmitted, InputBlocked), prompts.handle, per_key=True,
                 sealer=r.sealer)


def scheduler_stage(r: Resources) -> SchedulerStage:
    return SchedulerStage(r.settings, r.plans, r.pools, r.redis, sealer=r.sealer)


def persistence_stage(r: Resources) -> Stage:
    conversations = Conversations(r.db, r.sealer)
    saver = persistence.Persistence(conversations, Records(r.db, r.sealer), r.redis, r.topics,
                                    r.tokenizer("small").chat_ids, sealer=r.sealer, keep_nothing=r.keep_nothing,
                                    search=SearchIndex(r.db, conversations))
    return persistence.build_stage(r.settings, saver)


def settlement_stage(r: Resources) -> Stage:
    return settlement.build_stage(r.settings, r.quota)


def reaper_stage(r: Resources) -> Reaper:
    return Reaper(r.settings, r.quota, interval_s=r.settings.reaper_interval_s)


def usage_rollup_stage(r: Resources) -> FaustStage:
    return FaustStage(USAGE_ROLLUP, usage_rollup.build_app(r.settings, Records(r.db)))


def abandoned_stage(r: Resources) -> AbandonedDetector:
    return AbandonedDetector(r.settings, r.redis)


def purge_stage(r: Resources) -> Stage:
    return purge.build_stage(r.settings, r.db, r.redis, r.sealer.keys)


def retention_stage(r: Resources) -> RetentionSweeper:
    return RetentionSweeper(r.settings, Conversations(r.db, r.sealer), r.sealer.keys, r.redis, r.plans)


# The pipeline: stage name (its consumer group) -> how it is built, in the order a message passes them.
PIPELINE: dict[str, Callable[[Resources], Any]] = {
    ADMISSION: admission_stage,
    PROMPT: prompt_stage,
    SCHEDULER: scheduler_stage,
    PERSISTENCE: persistence_stage,
    SETTLEMENT: settlement_stage,
    REAPER: reaper_stage,
    USAGE_ROLLUP: usage_rollup_stage,
    ABANDONED: abandoned_stage,
    PURGE: purge_stage,
    RETENTION: retention_stage,
}


async def build_stages(settings: Settings, names: tuple[str, ...]) -> tuple[list[Any], Callable[[], Awaitable[None]]]:
    """The named stages, built over one set of clients; and the coroutine that closes those clients."""
    pools = {name: ready_pool(name, settings) for name in load_pools(settings)}
    plans = load_plans(settings.plans_file)
    redis = aioredis.Redis.from_url(settings.redis_url)
    cluster, session = connect(settings)
    db = AsyncSession(session)
    resources = Resources(settings, plans, pools, redis, db, Quota.configured(redis, plans, settings),
                          Topics(settings.topic_prefix, pools), configured(settings, db, redis))
    stages = [PIPELINE[name](resources) for name in names]
    resources.sealer.keys.start()  # heard from the first record on, so a live key is read once

    async def close() -> None:
        await redis.aclose()
        cluster.shutdown()

    return stages, close
