"""Owner epochs on the real Redis: the worker that took a generation over fences the one before it."""
from __future__ import annotations

from consumers.generation.fencing import STARTED_TTL_S, Fence
from infra.stores import keys
from schemas import new_id


async def test_the_second_owner_fences_the_first(redis_client) -> None:  # type: ignore[no-untyped-def]
    gid = new_id()
    first, second = Fence(redis_client), Fence(redis_client)
    assert await first.take(gid) == (1, None) and not await first.fenced(gid)
    assert (await second.take(gid))[0] == 2  # the first was presumed dead; its generation moved
    assert await first.fenced(gid) and not await second.fenced(gid)
    assert 0 < await redis_client.ttl(keys.generation_epoch(gid)) <= 24 * 3600


async def test_taking_a_generation_on_sets_its_started_marker_once(redis_client) -> None:  # type: ignore[no-untyped-def]
    """The first owner's pick-up sets the marker recovery reads saved tokens after; a later owner finds the first
    one's marker (so it reads the saved tokens from there) and does not move it."""
    gid = new_id()
    first, second = Fence(redis_client), Fence(redis_client)
    assert await first.take(gid, 1_000) == (1, None)
    assert await redis_client.get(keys.generation_started(gid)) == b"1000"
    assert 0 < await redis_client.ttl(keys.generation_started(gid)) <= STARTED_TTL_S
    assert await second.take(gid, 2_000) == (2, 1_000)
    assert await redis_client.get(keys.generation_started(gid)) == b"1000"
