"""Each gateway's CPU per token it delivers, at 1, 2 and 4 gateways: partition-affine tails against every
gateway tailing all of ``chat.tokens`` (the layout before), in one run.

Per layout, N gateway processes on a fresh prefix. ``own``: gateway i of N (``PARLEY_GATEWAY_INDEX``,
``PARLEY_GATEWAYS``) tails the partitions p with p % N == i. ``all``: every gateway tails every partition.
``--generations`` generations, minted onto the gateways' shares as the gateway that accepted each would mint
it, each followed by one SSE client on that gateway (owner key in Redis, as a POST writes it). Each gateway's
idle CPU rate is measured, then this process appends ``--records`` ``TokensAppended`` round-robin over the
generations and a finish for each; the window ends when every client has its ``message_end``. Per gateway: CPU
seconds less idle, over the tokens its clients received, and the records its tails fetched (its
``parley_gateway_tail_records`` counter) per token delivered. Ratios are against ``own``
at 1 gateway in the same run: flat is the target.

``--per-gateway``: ``--records`` and ``--generations`` are each gateway's, not the fleet's, and ``--rate`` paces
the appends at that many records a second per gateway: as the fleet grows, each gateway serves the same streams
at the same pace, which is the question "does a gateway's tail cost grow with the fleet" asks. Without it the
fleet's records are fixed and appended as fast as the broker takes them, so with more gateways each one gets a
smaller share, in smaller fetches.

``lb<N>``: ``own<N>`` with the clients going through HAProxy (the config `parley up --gateways N` writes), which
then sends a stream to whichever gateway has the fewest connections; HAProxy's own CPU per delivered token is the
hop's cost.

    python -m tests.benchmarks.bench_gateway_tail [--records 24000] [--generations 24] [--layouts own1,own2,...]
        [--per-gateway --rate 2000]
"""
from __future__ import annotations

import argparse
import asyncio
import dataclasses
import signal
import statistics
import subprocess
import time
from dataclasses import dataclass, field
from typing import Any

import httpx
import redis.asyncio as aioredis

from infra.config.settings import Settings
from infra.local import balancer
from infra.local.loadtest_service import free_port
from infra.stores import keys
from producers.gateway import ownership
from schemas import GenerationFinished, GenerationQueued, TokensAppended, Usage, encode
from tests.benchmarks import common
from tests.benchmarks.profiling import cpu_seconds
from tests.benchmarks.sse_client import SseStream
from topics import Topics
from topics.clients import make_producer, send

PARTITIONS = 6  # chat.tokens' partitions (topics/catalogue.py)
CHUNK = 1_000
PACE_S = 0.01  # --rate: a chunk of appends every 10 ms


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


async def follow(gateway: Gateway, gid: str, token: str, ready: asyncio.Event, deadline: float,
                 port: int | None = None) -> None:
    stream = SseStream(port or gateway.proc.port, "GET", f"/v1/generations/{gid}/stream", token)
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


async def layout(settings: Settings, mode: str, count: int, ns: argparse.Namespace, users: list[common.User],
                 redis: Any) -> dict[str, Any]:
    """One user per stream: a user may hold only ``max_streams_per_user`` streams on one gateway."""
    gateways: list[Gateway] = []
    tasks: list[asyncio.Task[None]] = []
    haproxy: subprocess.Popen[bytes] | None = None
    lb_port: int | None = None
    try:
        for i in range(count):
            env = {"PARLEY_GATEWAY_INDEX": str(i), "PARLEY_GATEWAYS": str(count)} if mode in ("own", "lb") else {}
            svc = common.service(settings, f"tail-{mode}{count}-{i}", **env)
            gateways.append(Gateway(i, svc.start_gateway(f"gateway-{i}")))
        if mode == "lb":  # the streams reach the gateways through HAProxy, as with `parley up --gateways N`
            haproxy, lb_port = start_haproxy(settings, [gw.proc.port for gw in gateways])
        generations, records = ((ns.generations * count, ns.records * count) if ns.per_gateway
                                else (ns.generations, ns.records))
        for n in range(generations):  # as each gateway would mint the ids of the replies it accepts
            gw = gateways[n % count]
            gw.gens.append(ownership.mint(ownership.owned(gw.index, count, PARTITIONS), PARTITIONS))
        gens = [g for gw in gateways for g in gw.gens]
        owner = dict(zip(gens, users[:len(gens)], strict=True))
        topic = Topics(settings.topic_prefix).tokens
        producer = make_producer(settings.kafka_bootstrap, linger_ms=5)
        await producer.start()
        try:
            async with redis.pipeline(transaction=False) as pipe:
                for gid in gens:
                    pipe.set(keys.generation_owner(gid), f"{owner[gid].user_id} bench-{gid}", ex=3600)
                await pipe.execute()
            await asyncio.gather(*[send(producer, topic, GenerationQueued(
                generation_id=gid, conversation_id=f"bench-{gid}", user_id=owner[gid].user_id, pool="large",
                model="bench", lane="paid", position=0, estimated_wait_s=0.0, message_id=gid), gid) for gid in gens])
            deadline = time.time() + 600
            readies = []
            for gw in gateways:
                for gid in gw.gens:
                    readies.append(asyncio.Event())
                    tasks.append(asyncio.create_task(follow(gw, gid, owner[gid].token, readies[-1], deadline,
                                                            lb_port)))
            await asyncio.wait_for(asyncio.gather(*[r.wait() for r in readies]), 120)
            await asyncio.sleep(2)
            before = {gw.index: cpu_seconds(gw.pid) for gw in gateways}
            lb_before = cpu_seconds(haproxy.pid) if haproxy else 0.0
            await asyncio.sleep(ns.idle_s)
            idle = {gw.index: (cpu_seconds(gw.pid) - before[gw.index]) / ns.idle_s for gw in gateways}
            lb_idle = (cpu_seconds(haproxy.pid) - lb_before) / ns.idle_s if haproxy else 0.0
            start = time.time()
            before = {gw.index: cpu_seconds(gw.pid) for gw in gateways}
            lb_before = cpu_seconds(haproxy.pid) if haproxy else 0.0
            read_before = {gw.index: gw.tail_records() for gw in gateways}
            # Acknowledged a chunk at a time (a loaded broker keeps up); paced, a chunk every PACE_S.
            chunk_size = max(1, int(ns.rate * count * PACE_S)) if ns.rate else CHUNK
            for n_chunk, chunk in enumerate(range(0, records, chunk_size)):
                if ns.rate:
                    await asyncio.sleep(max(0.0, start + n_chunk * PACE_S - time.time()))
                futures = []
                for i in range(chunk, min(chunk + chunk_size, records)):
                    gid = gens[i % len(gens)]
                    futures.append(await producer.send(topic, encode(TokensAppended(
                        generation_id=gid, conversation_id=f"bench-{gid}", seq=i // len(gens), text=" word",
                        token_ids=[1234])), key=gid.encode()))
                await asyncio.gather(*futures)
            seqs = records // len(gens)
            await asyncio.gather(*[send(producer, topic, GenerationFinished(
                generation_id=gid, conversation_id=f"bench-{gid}", user_id=owner[gid].user_id, plan="paid",
                message_id=gid, status="complete", text="", usage=Usage(completion_tokens=seqs), model="bench",
                pool="large", worker_id="bench", last_seq=seqs - 1), gid) for gid in gens])
        finally:
            await producer.stop()
        failed = [r for r in await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 600) if r]
        if failed:
            raise RuntimeError(f"{len(failed)} of {len(tasks)} streams failed: {failed[0]!r}")
        # Every stream has its end: each gateway's tail has read its partitions up to the last finish. The window
        # stops here, not after a wait for idle CPU, which on a loaded machine would add more idle to subtract.
        window = time.time() - start
        rows = []
        for gw in gateways:
            used = cpu_seconds(gw.pid) - before[gw.index] - idle[gw.index] * window
            read = gw.tail_records() - read_before[gw.index]
            rows.append({"gateway": gw.index, "delivered": gw.delivered, "records_read": int(read),
                         "cpu_s": round(used, 3), "cpu_us_per_token": round(used / max(gw.delivered, 1) * 1e6, 1),
                         "records_read_per_token": round(read / max(gw.delivered, 1), 2)})
        await redis.delete(*[keys.generation_owner(g) for g in gens])
        delivered = sum(gw.delivered for gw in gateways)
        lb = {"haproxy_cpu_us_per_token": round((cpu_seconds(haproxy.pid) - lb_before - lb_idle * window)
                                                / max(delivered, 1) * 1e6, 1)} if haproxy else {}
        return {"layout": mode, "gateways": count, "window_s": round(window, 1), "per_gateway": rows, **lb,
                "cpu_us_per_token": round(statistics.mean(r["cpu_us_per_token"] for r in rows), 1),
                "records_read_per_token": round(statistics.mean(r["records_read_per_token"] for r in rows), 2)}
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for gw in gateways:
            gw.proc.kill(signal.SIGTERM)
        if haproxy is not None:
            haproxy.terminate()
            haproxy.wait(timeout=10)


def start_haproxy(settings: Settings, ports: list[int]) -> tuple[subprocess.Popen[bytes], int]:
    """Debian's HAProxy with the config `parley up --gateways N` writes, in front of ``ports``."""
    binary = balancer.find_binary()
    if binary is None:
        raise RuntimeError("haproxy is not installed: apt-get install -y --no-install-recommends haproxy")
    port = free_port()
    at = settings.with_(ports=dataclasses.replace(settings.ports, gateway=port))
    path = common.RESULTS / f"haproxy-{port}.cfg"
    path.write_text(balancer.config(at, ports))
    proc = subprocess.Popen(balancer.command(binary, path), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(100):
        try:
            if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=2).status_code == 200:
                return proc, port
        except httpx.HTTPError:
            time.sleep(0.2)
    proc.terminate()
    raise RuntimeError("haproxy did not answer")


async def main(ns: argparse.Namespace) -> None:
    common.header("bench_gateway_tail: CPU per delivered token per gateway, own partitions vs all",
                  records=ns.records, generations=ns.generations, layouts=",".join(ns.layouts), idle_s=ns.idle_s,
                  per_gateway=ns.per_gateway, rate=ns.rate)
    settings = await common.bench_settings("gtail")
    most = max(int(n[len(n.rstrip("0123456789")):]) for n in ns.layouts) if ns.per_gateway else 1
    users = await common.make_users(settings, "paid", ns.generations * most)
    redis = aioredis.Redis.from_url(settings.redis_url)
    results = []
    try:
        for name in ns.layouts:
            mode, count = name.rstrip("0123456789"), int(name[len(name.rstrip("0123456789")):])
            row = await layout(settings, mode, count, ns, users, redis)
            results.append(row)
            hop = row.get("haproxy_cpu_us_per_token")
            print(f"   {mode:>3} x{count}: {row['cpu_us_per_token']:6.1f} us CPU per delivered token per gateway, "
                  f"{row['records_read_per_token']:.2f} records read per delivered token"
                  f"{f', HAProxy {hop:.1f} us per token' if hop is not None else ''} "
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
        "records": ns.records, "generations": ns.generations, "idle_s": ns.idle_s, "per_gateway": ns.per_gateway,
        "rate": ns.rate, "layouts": results})


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=24_000, help="token records, round-robin over generations")
    parser.add_argument("--generations", type=int, default=24, help="streams in all, split over the gateways")
    parser.add_argument("--layouts", type=lambda s: s.split(","), default=["own1", "own2", "own4", "all2", "all4"],
                        help="own<N> (partition-affine), all<N> (every gateway tails every partition), lb<N> "
                        "(own<N> with the streams through HAProxy)")
    parser.add_argument("--idle-s", type=float, default=5.0, help="seconds of idle CPU baseline per layout")
    parser.add_argument("--per-gateway", action="store_true",
                        help="--records and --generations per gateway: the fleet's grow with the gateways")
    parser.add_argument("--rate", type=float, default=0.0,
                        help="records a second per gateway (0: as fast as the broker takes them)")
    return parser.parse_args()


if __name__ == "__main__":
    asyncio.run(main(parse()))
