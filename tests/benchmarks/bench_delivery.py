"""Delivery fan-out: one gateway process streaming synthetic token events to 100, 300 and 500 SSE clients,
beside a bare aiokafka consumer reading the same topic at the same time.

Per level N: N generations, each owned by one of ten paid users (owner key in Redis, as the gateway's own
POST writes it) and each followed by one client (``GET /v1/generations/{id}/stream``). Once every client has
its ``message_start``, a producer process appends ``TokensAppended`` round-robin at a fixed total rate for a
fixed time (each event's text is its own ``at``), then a ``GenerationFinished`` per generation. A separate
process tails ``chat.tokens`` with a bare consumer. Lag = receipt time - ``at``; delivered events/s = events
received / (last receipt - first append). Producer, bare consumer and clients are three processes.

    python -m tests.benchmarks.bench_delivery [--quick] [--clients 100,300,500] [--rate 5000] [--seconds 10]
                                              [--profile]
"""
from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import redis.asyncio as aioredis

from infra.config.settings import Settings
from infra.stores import keys
from schemas import GenerationFinished, GenerationQueued, TokensAppended, Usage, decode_record, encode, new_id
from tests.benchmarks import common
from tests.benchmarks.profiling import Profiler, cpu_seconds
from tests.benchmarks.sse_client import SseStream
from topics import Topics
from topics.clients import assign_at_end, make_consumer, make_producer, send

USERS, CONNECTS_AT_ONCE = 10, 32


# -- the producer and the bare consumer, each in a process of its own -------------------------------------
async def produce(settings: Settings, gens: list[str], rate: float, seconds: float) -> dict[str, Any]:
    topic = Topics(settings.topic_prefix).tokens
    producer = make_producer(settings.kafka_bootstrap)  # the worker's settings: linger 0, acks all
    await producer.start()
    seqs, sent, futures = [0] * len(gens), 0, []
    start = time.time()
    try:
        while (elapsed := time.time() - start) < seconds:
            for _ in range(int(rate * elapsed) - sent):
                i = sent % len(gens)
                at = time.time()
                futures.append(await producer.send(topic, encode(TokensAppended(
                    generation_id=gens[i], conversation_id="bench", user_id="bench", seq=seqs[i], at=at,
                    text=repr(at), token_ids=[1])), key=gens[i].encode()))
                seqs[i] += 1
                sent += 1
            await asyncio.sleep(0.005)
        ended = time.time()
        await asyncio.gather(*futures)
        for gid, seq in zip(gens, seqs, strict=True):
            await send(producer, topic, _finished(gid, seq), gid)
    finally:
        await producer.stop()
    return {"sent": sent, "start": start, "seconds": ended - start, "rate": sent / (ended - start)}


def _finished(gid: str, seq: int) -> GenerationFinished:
    return GenerationFinished(generation_id=gid, conversation_id="bench", user_id="bench", plan="paid",
                              message_id=gid, status="complete", text="", usage=Usage(completion_tokens=seq),
                              model="bench", pool="large", worker_id="bench", last_seq=seq - 1)


async def bare(settings: Settings, expect: int, deadline_s: float) -> dict[str, Any]:
    topic = Topics(settings.topic_prefix).tokens
    consumer = make_consumer(settings.kafka_bootstrap, group_id=None, fetch_max_wait_ms=5)  # as the relay's
    await consumer.start()
    await assign_at_end(consumer, [topic])
    print("ready", flush=True)
    lags, finished, last = [], 0, 0.0
    deadline = time.time() + deadline_s
    try:
        while finished < expect and time.time() < deadline:
            batch = await consumer.getmany(timeout_ms=200, max_records=5000)
            now = time.time()
            for records in batch.values():
                for r in records:
                    e = decode_record(r)
                    if isinstance(e, TokensAppended):
                        lags.append(now - e.at)
                        last = now
                    elif isinstance(e, GenerationFinished):
                        finished += 1
    finally:
        await consumer.stop()
    return {"received": len(lags), "last": last, "lag_ms": common.summary(lags, 1000)}


def child(role: str, settings: Settings, args: list[str]) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "tests.benchmarks.bench_delivery", "--role", role,
                             "--prefix", settings.topic_prefix, *args], stdout=subprocess.PIPE, text=True)


async def child_result(proc: subprocess.Popen[str], timeout: float) -> dict[str, Any]:
    """The child's JSON line, waited for in a thread: the clients in this loop keep reading meanwhile."""
    out, _ = await asyncio.to_thread(proc.communicate, timeout=timeout)
    return json.loads(out.strip().splitlines()[-1])


# -- the clients, in this process ---------------------------------------------------------------------------
class Client:
    def __init__(self, port: int, gid: str, token: str) -> None:
        self.stream = SseStream(port, "GET", f"/v1/generations/{gid}/stream", token)
        self.ready = asyncio.Event()
        self.connect_s = float("nan")
        self.lags: list[float] = []
        self.last = 0.0
        self.ended = False

    async def run(self, gate: asyncio.Semaphore, deadline: float) -> None:
        try:
            async with gate:
                await self.stream.open()
                frames = self.stream.frames()
                first = await anext(frames)
                self.connect_s = first.received - self.stream.opened
                self.ready.set()
            while time.time() < deadline:
                f = await asyncio.wait_for(anext(frames), deadline - time.time())
                if f.event == "delta":
                    self.lags.append(f.received - float(f.data["text"]))
                    self.last = f.received
                elif f.event == "message_end":
                    self.ended = True
                    return
        except (TimeoutError, StopAsyncIteration, ConnectionError):
            return
        finally:
            self.ready.set()
            await self.stream.close()


async def level(settings: Settings, gateway: Any, users: list[common.User], n: int, rate: float,
                seconds: float, redis: Any, producer: Any, profile: bool) -> dict[str, Any]:
    topic = Topics(settings.topic_prefix).tokens
    gens = [new_id() for _ in range(n)]
    owners = [users[i % len(users)] for i in range(n)]
    async with redis.pipeline(transaction=False) as pipe:
        for gid, user in zip(gens, owners, strict=True):
            pipe.set(keys.generation_owner(gid), f"{user.user_id} bench-{gid}", ex=3600)
        await pipe.execute()
    await asyncio.gather(*[send(producer, topic, GenerationQueued(
        generation_id=gid, conversation_id=f"bench-{gid}", user_id=u.user_id, pool="large", model="bench",
        lane="paid", position=0, estimated_wait_s=0.0, message_id=gid), gid)
        for gid, u in zip(gens, owners, strict=True)])
    clients = [Client(gateway.port, gid, u.token) for gid, u in zip(gens, owners, strict=True)]
    gate = asyncio.Semaphore(CONNECTS_AT_ONCE)
    connect_started = time.time()
    tasks = [asyncio.create_task(c.run(gate, connect_started + 240 + seconds)) for c in clients]
    gens_file = common.RESULTS / f"delivery-gens-{n}.txt"
    try:
        await asyncio.wait_for(asyncio.gather(*[c.ready.wait() for c in clients]), 240)
        gens_file.write_text("\n".join(gens))
        bare_proc = child("bare", settings, ["--expect", str(n), "--seconds", str(seconds + 60)])
        assert bare_proc.stdout is not None
        assert (await asyncio.to_thread(bare_proc.stdout.readline)).strip() == "ready"
        profiler = Profiler({"gateway": gateway.popen.pid}, common.RESULTS / "profiles", f"delivery-{n}")
        profiling = profile and profiler.start()
        cpu = (cpu_seconds(gateway.popen.pid), time.process_time(), time.time())
        made = await child_result(child("producer", settings, ["--gens", str(gens_file), "--rate", str(rate),
                                                               "--seconds", str(seconds)]), seconds + 120)
        await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 120)
        wall = time.time() - cpu[2]
        busy = {"gateway": round((cpu_seconds(gateway.popen.pid) - cpu[0]) / wall, 2),
                "clients": round((time.process_time() - cpu[1]) / wall, 2)}
        prof = profiler.stop()["gateway"] if profiling else None
        bare_out = await child_result(bare_proc, 120)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        gens_file.unlink(missing_ok=True)
        await redis.delete(*[keys.generation_owner(g) for g in gens])
    connected = sum(c.connect_s == c.connect_s for c in clients)
    lags = [x for c in clients for x in c.lags]
    last = max((c.last for c in clients), default=0.0)
    return {"clients": n, "connected": connected, "ended": sum(c.ended for c in clients),
            "cpu_share_of_one_core": busy, "profile": prof,
            "connect_ms": common.summary([c.connect_s for c in clients if c.connect_s == c.connect_s], 1000),
            "offered_rate": round(made["rate"], 1), "sent": made["sent"],
            "gateway": {"received": len(lags), "events_per_s": round(len(lags) / (last - made["start"]), 1)
                        if last else 0.0, "lag_ms": common.summary(lags, 1000)},
            "bare_consumer": {"received": bare_out["received"],
                              "events_per_s": round(bare_out["received"] / (bare_out["last"] - made["start"]), 1)
                              if bare_out["last"] else 0.0, "lag_ms": bare_out["lag_ms"]}}


async def main(ns: argparse.Namespace) -> None:
    settings = await common.bench_settings("d")
    common.header("bench_delivery: one gateway fanning chat.tokens out to SSE clients vs a bare consumer",
                  engine="none (synthetic TokensAppended)", model="-", concurrency=ns.clients,
                  samples=f"{ns.rate:.0f} events/s for {ns.seconds:.0f} s per level", connects_at_once=CONNECTS_AT_ONCE)
    svc = common.service(settings, "bench_delivery")
    redis = aioredis.Redis.from_url(settings.redis_url)
    producer = make_producer(settings.kafka_bootstrap)
    await producer.start()
    rows = []
    try:
        gateway = svc.start_gateway("gateway-a")
        users = await common.make_users(settings, "paid", USERS)
        for n in ns.clients:
            row = await level(settings, gateway, users, n, ns.rate, ns.seconds, redis, producer, ns.profile)
            rows.append(row)
            g, b = row["gateway"], row["bare_consumer"]
            print(f"   {n:4d} clients ({row['connected']} connected, {row['ended']} ended; connect p50 "
                  f"{row['connect_ms']['p50']:.0f} ms): offered {row['offered_rate']:.0f}/s | gateway "
                  f"{g['events_per_s']:.0f}/s lag p50 {g['lag_ms']['p50']:.1f} p99 {g['lag_ms']['p99']:.1f} ms | "
                  f"bare {b['events_per_s']:.0f}/s lag p50 {b['lag_ms']['p50']:.1f} p99 {b['lag_ms']['p99']:.1f} ms | "
                  f"CPU busy (cores) {row['cpu_share_of_one_core']}")
            if row["profile"]:
                print(f"        gateway profile: top leaf {row['profile']['top_leaf'][:5]}")
                print(f"        by owner: {row['profile']['by_owner'][:6]}")
    finally:
        await producer.stop()
        await redis.aclose()
        common.stop_service(svc)
        await common.delete_topics(settings)
    common.write_result("bench_delivery", {"rate": ns.rate, "seconds": ns.seconds, "levels": rows})


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="CI-sized: 3 s per level")
    parser.add_argument("--clients", default="100,300,500", help="SSE clients per level, comma-separated")
    parser.add_argument("--rate", type=float, default=5000.0, help="token events per second, all generations")
    parser.add_argument("--seconds", type=float, default=None, help="append time per level (default 10, quick 3)")
    parser.add_argument("--profile", action="store_true", help="py-spy on the gateway during each level")
    parser.add_argument("--role", choices=("producer", "bare"), help=argparse.SUPPRESS)
    parser.add_argument("--prefix", help=argparse.SUPPRESS)
    parser.add_argument("--gens", help=argparse.SUPPRESS)
    parser.add_argument("--expect", type=int, default=0, help=argparse.SUPPRESS)
    ns = parser.parse_args()
    ns.clients = [int(x) for x in ns.clients.split(",")]
    ns.seconds = ns.seconds or (3.0 if ns.quick else 10.0)
    return ns


async def run_role(ns: argparse.Namespace) -> None:
    settings = Settings.from_env().with_(topic_prefix=ns.prefix)
    if ns.role == "producer":
        out = await produce(settings, Path(ns.gens).read_text().split(), ns.rate, ns.seconds)
    else:
        out = await bare(settings, ns.expect, ns.seconds)
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    args = parse()
    asyncio.run(run_role(args) if args.role else main(args))
