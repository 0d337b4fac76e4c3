"""The run's users: made in the service's keyspace (as `parley user create` does), or given as tokens."""
from __future__ import annotations

import asyncio

from infra.config.settings import Settings
from producers.loadgen.workload import User, mix_users


async def make_users(settings: Settings, paid: int, free: int) -> list[User]:
    """``paid`` + ``free`` new users with a bearer token each, interleaved by plan."""
    from infra.stores.accounts import Accounts
    from infra.stores.session import AsyncSession, connect

    cluster, session = await asyncio.to_thread(connect, settings)
    try:
        accounts = Accounts(AsyncSession(session))
        made = {plan: [await accounts.create_user(plan, "loadtest") for _ in range(n)]
                for plan, n in (("paid", paid), ("free", free))}
    finally:
        cluster.shutdown()
    return mix_users(*([User(u.user_id, token, plan) for u, token in made[plan]] for plan in ("paid", "free")))


def given(tokens: list[str]) -> list[User]:
    """Users from bearer tokens handed in (their plan is whatever the service holds; shown as 'given')."""
    return [User("", token, "given") for token in tokens]


def split(count: int, paid_share: float) -> tuple[int, int]:
    """(paid, free) of ``count`` users, at least one of each when both shares are above zero."""
    paid = round(count * paid_share)
    if 0 < paid_share < 1:
        paid = min(max(paid, 1), count - 1)
    return paid, count - paid
