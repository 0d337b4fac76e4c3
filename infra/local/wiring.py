"""Build the pipeline's stages from settings: the one place that knows what each stage needs."""
from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import redis.asyncio as aioredis

from infra.config.plans import load_plans
from infra.config.settings import Settings
from infra.stores.conversations import Conversations
from infra.stores.records import Records
from infra.stores.sealing import Sealer, configured
from infra.stores.session import AsyncSession, connect
from topics import Topics


async def build_stages(settings: Settings, names: tuple[str, ...]) -> tuple[list[Any], Callable[[], Awaitable[None]]]:
    from consumers.prompt.tokenizer import tokenizer_for
    from infra.config.pools import load_pools
    from infra.local.model import ready_pool as load_pool

    pools = {name: load_pool(name, settings) for name in load_pools(settings)}
    plans = load_plans()
    redis = aioredis.Redis.from_url(settings.redis_url)
    cluster, session = connect(settings)
    db = AsyncSession(session)
    sealer = configured(settings, db)  # one key cache for every stage of this process
    topics = Topics(settings.topic_prefix)

    def tokenizer(pool: str) -> Any:
        return tokenizer_for(str(pools[pool].model_path))

    builders: dict[str, Callable[[], Any]] = {
        "admission": lambda: _admission(settings, redis, plans, sealer),
        "prompt": lambda: _prompt(settings, db, topics, tokenizer, pools, plans, redis, sealer),
        "scheduler": lambda: _scheduler(settings, plans, pools, sealer),
        "persistence": lambda: _persistence(settings, db, redis, topics, tokenizer, plans, sealer),
        "purge": lambda: _purge(settings, db, redis, sealer),
        "retention": lambda: _retention(settings, db, redis, plans, sealer),
        "settlement": lambda: _streams("settlement", settings, redis, db, plans),
        "reaper": lambda: _streams("reaper", settings, redis, db, plans),
        "usage-rollup": lambda: _streams("usage-rollup", settings, redis, db, plans),
        "abandoned": lambda: _abandoned(settings, redis),
    }
    stages = [builders[name]() for name in names]

    async def close() -> None:
        await redis.aclose()
        cluster.shutdown()

    return stages, close


def _admission(settings: Settings, redis: Any, plans: Any, sealer: Sealer) -> Any:
    from consumers.admission import build_stage

    return build_stage(settings, redis, plans, sealer=sealer)


def _prompt(settings: Settings, db: AsyncSession, topics: Topics, tokenizer: Any, pools: Any, plans: Any,
            redis: Any, sealer: Sealer) -> Any:
    from consumers.prompt.builder import PromptBuilder
    from consumers.stage import Stage
    from schemas import RequestAdmitted

    builder = PromptBuilder(Conversations(db, sealer), Records(db, sealer), topics, tokenizer,
                            settings.prompt_budget_tokens, lambda pool: pools[pool].max_model_len,
                            quota=_quota(redis, plans), keep_nothing=_no_retention(plans))
    # Keyed by conversation: turns of one conversation are placed in order; other conversations concurrently.
    return Stage("prompt", settings, "admitted", (RequestAdmitted,), builder.handle, per_key=True, sealer=sealer)


def _scheduler(settings: Settings, plans: Any, pools: Any, sealer: Sealer) -> Any:
    from consumers.scheduler.stage import SchedulerStage

    return SchedulerStage(settings, plans, pools, sealer=sealer)


def _persistence(settings: Settings, db: AsyncSession, redis: Any, topics: Topics, tokenizer: Any, plans: Any,
                 sealer: Sealer) -> Any:
    from streams.app import FaustStage, make_app
    from streams.persistence import Persistence, build_app

    app = make_app("persistence", settings)
    persistence = Persistence(Conversations(db, sealer), Records(db, sealer), redis, topics,
                              tokenizer("small").chat_ids, sealer=sealer, keep_nothing=_no_retention(plans))
    build_app(app, persistence, topics)
    return FaustStage("persistence", app)


def _purge(settings: Settings, db: AsyncSession, redis: Any, sealer: Sealer) -> Any:
    from consumers.purge import build_stage

    return build_stage(settings, db, redis, sealer.keys)


def _retention(settings: Settings, db: AsyncSession, redis: Any, plans: Any, sealer: Sealer) -> Any:
    from consumers.retention import RetentionSweeper

    return RetentionSweeper(settings, Conversations(db, sealer), sealer.keys, redis, plans)


def _no_retention(plans: Any) -> frozenset[str]:
    return frozenset(name for name, plan in plans.items() if plan.no_retention)


def _abandoned(settings: Settings, redis: Any) -> Any:
    from consumers.abandoned import AbandonedDetector

    return AbandonedDetector(settings, redis)


def _streams(name: str, settings: Settings, redis: Any, db: AsyncSession, plans: Any) -> Any:
    """Settlement, reaper and usage rollup (streams/): each module exposes ``build_stage``."""
    import importlib

    module = importlib.import_module(f"streams.{name.replace('-', '_')}")
    return module.build_stage(settings, redis, db, plans)


def _quota(redis: Any, plans: Any) -> Any:
    try:
        from infra.stores.quota import Quota
    except ImportError:
        return None
    return Quota(redis, plans)
