"""A gateway stream's cost per live event: the wait on its queue, before and after one timer per stream.

In-process, no services. One producer task puts ``--events`` events into a stream's queue, yielding to the
loop after each, so the stream is waiting when each event comes (as it is when a record arrives from Kafka
every 100 ms). Two consumers of the same events, each run ``--repeats`` times, best run kept:

* ``wait_for`` (the former design): ``asyncio.wait_for(queue.get(), 1.0)`` around every get, so a quiet
  stream can send a keep-alive or look for a lost worker; a task and a timer handle per event.
* ``paced`` (``producers/gateway/pacing.py``): one ticker per stream puts a tick in the same queue; the
  stream waits on ``queue.get()`` alone.

CPU time of this process per event (producer's put included, both sides alike), and the ratio.

    python -m tests.benchmarks.bench_stream_pacing [--events 200000] [--repeats 3] [--smoke]
"""
from __future__ import annotations

import argparse
import asyncio
import time
from typing import Any

from producers.gateway.pacing import paced
from tests.benchmarks import common

EVERY_S = 1.0


async def _feed(queue: asyncio.Queue[Any], n: int) -> None:
    for i in range(n):
        queue.put_nowait((i, None))
        await asyncio.sleep(0)  # the stream wakes for each event, as it does for records from the tail
    queue.put_nowait((n, "end"))


async def with_wait_for(n: int) -> int:
    queue: asyncio.Queue[Any] = asyncio.Queue()
    feeder, got = asyncio.create_task(_feed(queue, n)), 0
    while True:
        try:
            _, event = await asyncio.wait_for(queue.get(), EVERY_S)
        except TimeoutError:
            continue
        if event == "end":
            break
        got += 1
    await feeder
    return got


async def with_paced(n: int) -> int:
    queue: asyncio.Queue[Any] = asyncio.Queue()
    feeder, got = asyncio.create_task(_feed(queue, n)), 0
    async for item in paced(queue, EVERY_S, every_tick=True):
        if item is None:
            continue
        if item[1] == "end":
            break
        got += 1
    await feeder
    return got


def per_event_us(design: Any, n: int, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        start = time.process_time()
        assert asyncio.run(design(n)) == n
        best = min(best, time.process_time() - start)
    return best / n * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--events", type=int, default=200_000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--smoke", action="store_true", help="2,000 events, one run: checks that it runs")
    args = ap.parse_args()
    n, repeats = (2_000, 1) if args.smoke else (args.events, args.repeats)
    common.header("stream pacing: CPU per live event", events=n, repeats=repeats)
    before, after = per_event_us(with_wait_for, n, repeats), per_event_us(with_paced, n, repeats)
    print(f"   wait_for per event  {before:6.2f} us   (former: a task and a timer per event)")
    print(f"   paced per event     {after:6.2f} us   (one ticker per stream)")
    print(f"   before/after        {common.ratio(before, after):6.2f}x")
    common.write_result("stream_pacing", {"events": n, "repeats": repeats, "wait_for_us_per_event": round(before, 3),
                                          "paced_us_per_event": round(after, 3),
                                          "ratio": common.ratio(before, after)})


if __name__ == "__main__":
    main()
