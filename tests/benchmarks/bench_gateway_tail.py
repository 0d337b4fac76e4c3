"""Each gateway's CPU per token it delivers, at 1, 2 and 4 gateways: partition-affine tails against every
gateway tailing all of ``chat.tokens`` (the layout before), in one run.

Per layout, N gateway processes on a fresh prefix. ``own``: gateway i of N (``PARLEY_GATEWAY_INDEX``,
``PARLEY_GATEWAYS``) tails the partitions p with p % N == i. ``all``: every gateway tails every partition.
``--generations`` generations, minted onto the gateways' shares as the gateway that accepted each would mint
it, each followed by one SSE client on that gateway (owner key in Redis, as a POST writes it). Each gateway's
idle CPU rate is measured, then this process appends ``--records`` ``TokensAppended`` round-robin over the
generations and a finish for each, and waits until every client has its ``message_end`` and every gateway is
back at its idle rate. Per gateway: CPU seconds less idle, over the tokens its clients received, and the records
its tails fetched (its ``parley_gateway_tail_records`` counter) per token delivered. Ratios are against ``own``
at 1 gateway in the same run: flat is the target.

    python -m tests.benchmarks.bench_gateway_tail [--records 24000] [--generations 24] [--layouts own1,own2,...]
"""
from __future__ import annotations

import argparse
import asyncio
import signal
import statistics
import time
from dataclasses import dataclass, field
from typing import Any

import httpx
import redis.asyncio as aioredis

from infra.config.settings import Settings
from infra.stores import keys
from producers.gateway import ownership
from schemas import GenerationFinished, GenerationQueued, TokensAppended, Usage, encode
from tests.benchmarks import common
from tests.benchmarks.bench_relay_tail import settle
from tests.benchmarks.profiling import cpu_seconds
from tests.benchmarks.sse_client import SseStream
from topics import Topics
from topics.clients import make_producer, send

PARTITIONS = 6  # chat.tokens' partitions (topics/catalogue.py)


@dataclass
class Gateway:
    index: int
    proc: Any
    gens: list[str] = field(default_factory=list)
    delivered: int = 0

    @property
    def pid(self) -> int:
        return int(self.proc.popen.pid)

    def tail_records(self) -> float:
        text = httpx.get(f"http://127.0.0.1:{self.proc.port}/metrics", timeout=10).text
        return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                   if line.startswith("parley_gateway_tail_records_total"))


async def follow(gateway: Gateway, gid: str, token: str, ready: asyncio.Event, deadline: float) -> None:
    stream = SseStream(gateway.proc.port, "GET", f"/v1/generations/{gid}/stream", token)
    try:
        await stream.open()
        frames = stream.frames()
        await anext(frames)  # message_start
        ready.set()
        while time.time() < deadline:
            frame = await asyncio.wait_for(anext(frames), deadline - time.time())
            if frame.event == "delta":
                gateway.delivered += 1
            elif frame.event == "message_end":
                return
    finally:
        ready.set()
        await stream.close()


async def layout(settings: Settings, mode: str, count: int, ns: argparse.Namespace, user: common.User,
                 redis: Any) -> dict[str, Any]:
    gateways: list[Gateway] = []
    try:
        for i in range(count):
            env = {"PARLEY_GATEWAY_INDEX": str(i), "PARLEY_GATEWAYS": str(count)} if mode == "own" else {}
            svc = common.service(settings, f"tail-{mode}{count}-{i}", **env)
            gateways.append(Gateway(i, svc.start_gateway(f"gateway-{i}")))
        for n in range(ns.generations):  # as each gateway would mint the ids of the replies it accepts
            gw = gateways[n % count]
            gw.gens.append(ownership.mint(ownership.owned(gw.index, count, PARTITIONS), PARTITIONS))
        gens = [g for gw in gateways for g in gw.gens]
        topic = Topics(settings.topic_prefix).tokens
        producer = make_producer(settings.kafka_bootstrap, linger_ms=5)
        await producer.start()
        try:
            async with redis.pipeline(transaction=False) as pipe:
                for gid in gens:
                    pipe.set(keys.generation_owner(gid), f"{user.user_id} bench-{gid}", ex=3600)
                await pipe.execute()
            await asyncio.gather(*[send(producer, topic, GenerationQueued(
                generation_id=gid, conversation_id=f"bench-{gid}", user_id=user.user_id, pool="large",
                model="bench", lane="paid", position=0, estimated_wait_s=0.0, message_id=gid), gid) for gid in gens])
            deadline = time.time() + 600
            readies, tasks = [], []
            for gw in gateways:
                for gid in gw.gens:
                    readies.append(asyncio.Event())
                    tasks.append(asyncio.create_task(follow(gw, gid, user.token, readies[-1], deadline)))
            await asyncio.wait_for(asyncio.gather(*[r.wait() for r in readies]), 120)
            await asyncio.sleep(2)
            before = {gw.index: cpu_seconds(gw.pid) for gw in gateways}
            await asyncio.sleep(ns.idle_s)
            idle = {gw.index: (cpu_seconds(gw.pid) - before[gw.index]) / ns.idle_s for gw in gateways}
            start = time.time()
            before = {gw.index: cpu_seconds(gw.pid) for gw in gateways}
            read_before = {gw.index: gw.tail_records() for gw in gateways}
            futures = []
            for i in range(ns.records):
                gid = gens[i % len(gens)]
                futures.append(await producer.send(topic, encode(TokensAppended(
                    generation_id=gid, conversation_id=f"bench-{gid}", user_id=user.user_id, seq=i // len(gens),
                    text=" word", token_ids=[1234])), key=gid.encode()))
            await asyncio.gather(*futures)
            seqs = ns.records // len(gens)
            await asyncio.gather(*[send(producer, topic, GenerationFinished(
                generation_id=gid, conversation_id=f"bench-{gid}", user_id=user.user_id, plan="paid",
                message_id=gid, status="complete", text="", usage=Usage(completion_tokens=seqs), model="bench",
                pool="large", worker_id="bench", last_seq=seqs - 1), gid) for gid in gens])
        finally:
            await producer.stop()
        await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 600)
        await asyncio.gather(*[settle(gw.pid, idle[gw.index]) for gw in gateways])
        window = time.time() - start
        rows = []
        for gw in gateways:
            used = cpu_seconds(gw.pid) - before[gw.index] - idle[gw.index] * window
            read = gw.tail_records() - read_before[gw.index]
            rows.append({"gateway": gw.index, "delivered": gw.delivered, "records_read": int(read),
                         "cpu_s": round(used, 3), "cpu_us_per_token": round(used / max(gw.delivered, 1) * 1e6, 1),
                         "records_read_per_token": round(read / max(gw.delivered, 1), 2)})
        await redis.delete(*[keys.generation_owner(g) for g in gens])
        return {"layout": mode, "gateways": count, "window_s": round(window, 1), "per_gateway": rows,
                "cpu_us_per_token": round(statistics.mean(r["cpu_us_per_token"] for r in rows), 1),
                "records_read_per_token": round(statistics.mean(r["records_read_per_token"] for r in rows), 2)}
    finally:
        for gw in gateways:
            gw.proc.kill(signal.SIGTERM)


async def main(ns: argparse.Namespace) -> None:
    common.header("bench_gateway_tail: CPU per delivered token per gateway, own partitions vs all",
                  records=ns.records, generations=ns.generations, layouts=",".join(ns.layouts), idle_s=ns.idle_s)
    settings = await common.bench_settings("gtail")
    (user,) = await common.make_users(settings, "paid", 1)
    redis = aioredis.Redis.from_url(settings.redis_url)
    results = []
    try:
        for name in ns.layouts:
            mode, count = name.rstrip("0123456789"), int(name[len(name.rstrip("0123456789")):])
            row = await layout(settings, mode, count, ns, user, redis)
            results.append(row)
            print(f"   {mode:>3} x{count}: {row['cpu_us_per_token']:6.1f} us CPU per delivered token per gateway, "
                  f"{row['records_read_per_token']:.2f} records read per delivered token "
                  f"(each: {[(r['cpu_us_per_token'], r['delivered'], r['records_read']) for r in row['per_gateway']]})",
                  flush=True)
    finally:
        await redis.aclose()
        await common.delete_topics(settings)
    base = next((r for r in results if r["layout"] == "own" and r["gateways"] == 1), results[0])
    print("   ratio to own x1 (CPU per delivered token per gateway; records read per delivered token):")
    for r in results:
        print(f"     {r['layout']:>3} x{r['gateways']}: {r['cpu_us_per_token'] / base['cpu_us_per_token']:.2f}  "
              f"{r['records_read_per_token'] / base['records_read_per_token']:.2f}")
    common.write_result(f"gateway-tail-{time.strftime('%Y%m%d-%H%M%S')}", {
        "records": ns.records, "generations": ns.generations, "idle_s": ns.idle_s, "layouts": results})


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=24_000, help="token records, round-robin over generations")
    parser.add_argument("--generations", type=int, default=24, help="streams in all, split over the gateways")
    parser.add_argument("--layouts", type=lambda s: s.split(","), default=["own1", "own2", "own4", "all2", "all4"],
                        help="own<N> (partition-affine) and all<N> (every gateway tails every partition)")
    parser.add_argument("--idle-s", type=float, default=3.0, help="seconds of idle CPU baseline per layout")
    return parser.parse_args()


if __name__ == "__main__":
    asyncio.run(main(parse()))
