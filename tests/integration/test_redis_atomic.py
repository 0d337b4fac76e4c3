"""One atomic Lua update under concurrent callers: the budget is never overspent."""
from __future__ import annotations

import asyncio
import uuid

RESERVE = """
local left = tonumber(redis.call('GET', KEYS[1]) or ARGV[2])
local want = tonumber(ARGV[1])
if want > left then return -1 end
redis.call('SET', KEYS[1], left - want)
return left - want
"""


async def test_concurrent_reservations_never_overspend(redis_client) -> None:  # type: ignore[no-untyped-def]
    key = f"test:budget:{uuid.uuid4().hex}"
    script = redis_client.register_script(RESERVE)
    results = await asyncio.gather(*[script(keys=[key], args=[7, 100]) for _ in range(60)])
    granted = [r for r in results if r >= 0]
    assert len(granted) == 100 // 7  # exactly as many as fit: no lost update, no over-grant
    assert int(await redis_client.get(key)) == 100 - 7 * len(granted)
    assert sorted(granted, reverse=True) == [100 - 7 * i for i in range(1, len(granted) + 1)]
    await redis_client.delete(key)
