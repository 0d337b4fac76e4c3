"""The gateway relay's CPU per record of other generations' events: every gateway tails all of
``chat.tokens``, so each token event anywhere in the fleet costs every gateway something.

One gateway process on a fresh prefix, nobody streaming from it. (1) Its idle CPU rate over ``--idle-s``.
(2) This process appends ``--records`` ``TokensAppended`` for generations nobody follows (one token each,
as the worker emits one event per engine step per sequence), then waits until the gateway's CPU use is
back at its idle rate (the tail has caught up). The gateway's CPU seconds for the window, less the idle
rate times the window, divided by the records, is its cost per record. CPU time, not wall time: it holds
on a loaded machine. For comparison, the same process times what the relay would spend decoding every
value instead of dropping records by key first.

    python -m tests.benchmarks.bench_relay_tail [--records 200000] [--idle-s 5] [--profile] [--smoke]
"""
from __future__ import annotations

import argparse
import asyncio
import time
from typing import Any

from schemas import TokensAppended, decode, encode, new_id
from tests.benchmarks import common
from tests.benchmarks.profiling import Profiler, cpu_seconds
from topics import Topics
from topics.clients import make_producer

GENERATIONS = 256  # other generations in flight, round-robin


def event(gid: str, seq: int) -> bytes:
    return encode(TokensAppended(generation_id=gid, conversation_id=new_id(), user_id=new_id(), seq=seq,
                                 at=time.time(), text=" word", token_ids=[1234]))


async def produce(bootstrap: str, topic: str, n: int) -> float:
    gens = [new_id() for _ in range(GENERATIONS)]
    producer = make_producer(bootstrap, linger_ms=5)  # batched: the tail's cost, not the producer's, is measured
    await producer.start()
    start = time.time()
    try:
        futures = [await producer.send(topic, event(gens[i % GENERATIONS], i // GENERATIONS),
                                       key=gens[i % GENERATIONS].encode()) for i in range(n)]
        await asyncio.gather(*futures)
    finally:
        await producer.stop()
    return time.time() - start


async def settle(pid: int, idle_rate: float, step_s: float = 1.0, patience: int = 3) -> None:
    """Until the gateway's CPU over ``step_s`` is near its idle rate ``patience`` times in a row."""
    calm = 0
    while calm < patience:
        before = cpu_seconds(pid)
        await asyncio.sleep(step_s)
        calm = calm + 1 if cpu_seconds(pid) - before <= idle_rate * step_s + 0.02 else 0


def decode_cost(n: int) -> dict[str, float]:
    """CPU per record, in this process, of the key filter alone against decoding every value."""
    values = [(new_id().encode(), event(new_id(), i)) for i in range(n)]
    subs: dict[str, Any] = {}
    t0 = time.process_time()
    for key, _ in values:
        subs.get(key.decode())
    t1 = time.process_time()
    for _, value in values:
        decode(value)
    t2 = time.process_time()
    return {"key_filter_us": round((t1 - t0) / n * 1e6, 3), "decode_us": round((t2 - t1) / n * 1e6, 3),
            "value_bytes": len(values[0][1])}


async def main(ns: argparse.Namespace) -> None:
    common.header("bench_relay_tail: gateway CPU per record of unwatched generations on chat.tokens",
                  records=ns.records, generations=GENERATIONS, idle_s=ns.idle_s)
    settings = await common.bench_settings("relay")
    svc = common.service(settings, "relay")
    try:
        pid = svc.start_gateway("gateway-a").popen.pid
        await asyncio.sleep(2)  # start-up work done
        before = cpu_seconds(pid)
        await asyncio.sleep(ns.idle_s)
        idle_rate = (cpu_seconds(pid) - before) / ns.idle_s
        profiler = Profiler({"gateway": pid}, common.RESULTS / "profiles", "relay-tail") if ns.profile else None
        profiling = profiler.start() if profiler else False
        start, before = time.time(), cpu_seconds(pid)
        produce_s = await produce(settings.kafka_bootstrap, Topics(settings.topic_prefix).tokens, ns.records)
        await settle(pid, idle_rate)
        window = time.time() - start
        used = cpu_seconds(pid) - before - idle_rate * window
        profile = profiler.stop() if profiling and profiler else {}
    finally:
        common.stop_service(svc)
        await common.delete_topics(settings)
    per_record_us = used / ns.records * 1e6
    half_core_rate = 0.5 / (used / ns.records) if used > 0 else float("inf")
    micro = decode_cost(min(ns.records, 50_000))
    fleet = {f"{rate} tok/s": round(rate * used / ns.records, 3) for rate in (60_000, 600_000)}
    print(f"   idle {idle_rate * 1000:.1f} ms CPU/s; produced in {produce_s:.1f} s, window {window:.1f} s")
    print(f"   gateway tail: {per_record_us:.1f} us CPU per record ({used:.2f} s for {ns.records})")
    print(f"   half a core at {half_core_rate:,.0f} records/s; cores at fleet rate: {fleet}")
    print(f"   in-process: key filter {micro['key_filter_us']} us/record, decode {micro['decode_us']} us/record "
          f"({micro['value_bytes']} B values)")
    for name, prof in profile.items():
        print(f"   profile {name}: by owner {prof.get('by_owner')}\n   top leaf {prof.get('top_leaf', [])[:5]}")
    common.write_result(f"relay-tail-{time.strftime('%Y%m%d-%H%M%S')}", {
        "records": ns.records, "generations": GENERATIONS, "idle_cpu_per_s": round(idle_rate, 4),
        "window_s": round(window, 2), "produce_s": round(produce_s, 2), "cpu_s": round(used, 3),
        "cpu_us_per_record": round(per_record_us, 2), "half_core_records_per_s": round(half_core_rate),
        "cores_at_fleet_rate": fleet, "in_process": micro, "profile": profile})


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=200_000, help="token events for unwatched generations")
    parser.add_argument("--idle-s", type=float, default=5.0, help="seconds of idle CPU baseline")
    parser.add_argument("--profile", action="store_true", help="py-spy on the gateway while it catches up")
    parser.add_argument("--smoke", action="store_true", help="20,000 records, 2 s baseline")
    ns = parser.parse_args()
    if ns.smoke:
        ns.records, ns.idle_s = 20_000, 2.0
    return ns


if __name__ == "__main__":
    asyncio.run(main(parse()))
