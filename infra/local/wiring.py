"""Build the pipeline's stages from settings: the one place that knows what each stage needs."""
from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import redis.asyncio as aioredis

from infra.config.plans import load_plans
from infra.config.settings import Settings
from infra.stores.conversations import Conversations
from infra.stores.records import Records
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
    topics = Topics(settings.topic_prefix)

    def tokenizer(pool: str) -> Any:
        return tokenizer_for(str(pools[pool].model_path))

    builders: dict[str, Callable[[], Any]] = {
        "admission": lambda: _admission(settings, redis, plans, pools),
        "prompt": lambda: _prompt(settings, db, topics, tokenizer, pools, plans, redis),
        "scheduler": lambda: _scheduler(settings, plans, pools, redis),
        "persistence": lambda: _persistence(settings, db, redis, topics, tokenizer),
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


def _admission(settings: Settings, redis: Any, plans: Any, pools: Any) -> Any:
    from consumers.admission import build_stage

    return build_stage(settings, redis, plans)


def _prompt(settings: Settings, db: AsyncSession, topics: Topics, tokenizer: Any, pools: Any, plans: Any,
            redis: Any) -> Any:
    from consumers.prompt.builder import PromptBuilder
    from consumers.stage import Stage
    from schemas import RequestAdmitted

    builder = PromptBuilder(Conversations(db), Records(db), topics, tokenizer, settings.prompt_budget_tokens,
                            lambda pool: pools[pool].max_model_len, quota=_quota(redis, plans, settings),
                            redis=redis, same_model=lambda a, b: pools[a].model_path == pools[b].model_path)
    # Keyed by conversation: turns of one conversation are placed in order; other conversations concurrently.
    return Stage("prompt", settings, "admitted", (RequestAdmitted,), builder.handle, per_key=True)


def _scheduler(settings: Settings, plans: Any, pools: Any, redis: Any) -> Any:
    from consumers.scheduler.stage import SchedulerStage

    return SchedulerStage(settings, plans, pools, redis)


def _persistence(settings: Settings, db: AsyncSession, redis: Any, topics: Topics, tokenizer: Any) -> Any:
    from streams.app import FaustStage, make_app
    from streams.persistence import Persistence, build_app

    app = make_app("persistence", settings)
    persistence = Persistence(Conversations(db), Records(db), redis, topics, tokenizer("small").chat_ids)
    build_app(app, persistence, topics)
    return FaustStage("persistence", app)


def _abandoned(settings: Settings, redis: Any) -> Any:
    from consumers.abandoned import AbandonedDetector

    return AbandonedDetector(settings, redis)


def _streams(name: str, settings: Settings, redis: Any, db: AsyncSession, plans: Any) -> Any:
    """Settlement, reaper and usage rollup (streams/): each module exposes ``build_stage``."""
    import importlib

    module = importlib.import_module(f"streams.{name.replace('-', '_')}")
    return module.build_stage(settings, redis, db, plans)


def _quota(redis: Any, plans: Any, settings: Settings) -> Any:
    try:
        from infra.stores.quota import Quota
    except ImportError:
        return None
    return Quota.configured(redis, plans, scope=settings.topic_prefix)  # release touches the scoped sets
