"""A stream's pacing: events pass through, silence shows as ``None``, and no timer or task per event."""
from __future__ import annotations

import asyncio
from typing import Any

from producers.gateway.pacing import paced


async def test_events_pass_through_in_order_and_silence_is_none_after_a_quiet_interval() -> None:
    queue: asyncio.Queue[Any] = asyncio.Queue()
    for i in range(3):
        queue.put_nowait((i, "e"))
    got: list[Any] = []
    async for item in paced(queue, 0.02):
        got.append(item)
        if item is None:
            break
    assert got == [(0, "e"), (1, "e"), (2, "e"), None]


async def test_a_busy_stream_sees_no_silence_unless_it_asks_for_every_tick() -> None:
    async def run(every_tick: bool) -> int:
        queue: asyncio.Queue[Any] = asyncio.Queue()
        nones = 0

        async def feed() -> None:
            for i in range(40):
                queue.put_nowait((i, "e"))
                await asyncio.sleep(0.005)
            queue.put_nowait((40, "end"))
        feeder = asyncio.create_task(feed())
        async for item in paced(queue, 0.03, every_tick=every_tick):
            nones += item is None
            if item is not None and item[1] == "end":
                break
        await feeder
        return nones
    assert await run(every_tick=False) == 0
    assert await run(every_tick=True) >= 2


async def test_events_cost_no_task_each_and_the_ticker_ends_with_the_stream() -> None:
    loop = asyncio.get_running_loop()
    created: list[str] = []
    default = loop.get_task_factory()

    def counting(lp: asyncio.AbstractEventLoop, coro: Any, **kw: Any) -> asyncio.Task[Any]:
        created.append(getattr(coro, "__qualname__", ""))
        return asyncio.Task(coro, loop=lp, **kw)
    earlier = tickers()  # the other tests' streams, closing
    loop.set_task_factory(counting)
    try:
        queue: asyncio.Queue[Any] = asyncio.Queue()
        for i in range(1000):
            queue.put_nowait((i, "e"))
        stream = paced(queue, 10.0)
        assert [item async for item, _ in zip_n(stream, 1000)] == [(i, "e") for i in range(1000)]
        running = [t for t in tickers() if t not in earlier]
        await stream.aclose()
        await asyncio.sleep(0)
    finally:
        loop.set_task_factory(default)
    assert created == ["_tick"] and len(running) == 1 and not [t for t in tickers() if t not in earlier]


def tickers() -> list[asyncio.Task[Any]]:
    return [t for t in asyncio.all_tasks() if t.get_name() == "stream-ticker" and not t.done()]


async def zip_n(stream: Any, n: int) -> Any:
    for _ in range(n):
        yield await stream.__anext__(), None
