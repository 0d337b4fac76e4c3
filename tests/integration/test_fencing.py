"""Owner epochs on the real Redis: the worker that took a generation over fences the one before it."""
from __future__ import annotations

from consumers.generation.fencing import Fence
from infra.stores import keys
from schemas import new_id


async def test_the_second_owner_fences_the_first(redis_client) -> None:  # type: ignore[no-untyped-def]
    gid = new_id()
    first, second = Fence(redis_client), Fence(redis_client)
    assert await first.take(gid) == 1 and not await first.fenced(gid)
    assert await second.take(gid) == 2  # the first was presumed dead; its generation moved
    assert await first.fenced(gid) and not await second.fenced(gid)
    assert 0 < await redis_client.ttl(keys.generation_epoch(gid)) <= 24 * 3600
