"""Resume latency: reconnect with ``Last-Event-ID`` -> first replayed event, for a fresh generation and a
five-minute-old one, through one gateway.

Generations are synthetic: a ``GenerationQueued``, ``--deltas`` ``TokensAppended`` and a
``GenerationFinished`` each, appended to ``chat.tokens`` the way the scheduler and a worker append them,
owned by paid users (owner key in Redis, as the gateway's POST writes it). Meanwhile a filler appends
other generations' tokens at ``--filler-rate`` events/s, so the partitions grow as they would in service.
Each sample reconnects with the offset of the generation's ``--resume-after``-th delta as Last-Event-ID and
times the first replayed frame (it must be the next event) and the replay's ``message_end``.

The full run waits 5 minutes for the old set (bounded); ``--quick`` waits ``--age-s`` (30 s) and prints it.

    python -m tests.benchmarks.bench_resume [--quick] [--samples 20] [--age-s 300] [--filler-rate 200]
"""
from __future__ import annotations

import argparse
import asyncio
import time
from typing import Any

import redis.asyncio as aioredis

from infra.stores import keys
from schemas import GenerationFinished, GenerationQueued, TokensAppended, Usage, encode, new_id
from tests.benchmarks import common
from tests.benchmarks.sse_client import SseStream
from topics import Topics
from topics.clients import make_producer, send


async def generation(producer: Any, topic: str, redis: Any, user: common.User, deltas: int) -> dict[str, Any]:
    gid = new_id()
    await redis.set(keys.generation_owner(gid), f"{user.user_id} bench-{gid}", ex=3600)
    conv, uid = f"bench-{gid}", user.user_id
    offsets = [(await send(producer, topic, GenerationQueued(
        generation_id=gid, conversation_id=conv, user_id=uid, pool="large", model="bench", lane="paid", position=0,
        estimated_wait_s=0.0, message_id=gid), gid)).offset]
    for seq in range(deltas):
        offsets.append((await send(producer, topic, TokensAppended(
            generation_id=gid, conversation_id=conv, user_id=uid, seq=seq, text=f" t{seq}", token_ids=[seq]),
            gid)).offset)
    offsets.append((await send(producer, topic, GenerationFinished(
        generation_id=gid, conversation_id=conv, user_id=uid, plan="paid", message_id=gid, status="complete",
        text="", usage=Usage(completion_tokens=deltas), model="bench", pool="large", worker_id="bench",
        last_seq=deltas - 1), gid)).offset)
    return {"gid": gid, "user": user, "offsets": offsets, "made": time.time()}


async def filler(producer: Any, topic: str, rate: float, stop: asyncio.Event) -> int:
    """Other generations' tokens, nobody reading them; the partitions grow as in service."""
    sent, gids, start = 0, [new_id() for _ in range(50)], time.time()
    while not stop.is_set():
        for _ in range(int(rate * (time.time() - start)) - sent):
            gid = gids[sent % len(gids)]
            await producer.send(topic, encode(TokensAppended(
                generation_id=gid, conversation_id="filler", user_id="filler", seq=sent, text=" x",
                token_ids=[1])), key=gid.encode())
            sent += 1
        await asyncio.sleep(0.05)
    return sent


async def resume(port: int, gen: dict[str, Any], after_index: int) -> dict[str, float]:
    last_id = gen["offsets"][after_index]
    stream = SseStream(port, "GET", f"/v1/generations/{gen['gid']}/stream", gen["user"].token,
                       headers={"Last-Event-ID": str(last_id)})
    try:
        await stream.open()
        frames = stream.frames()
        first = await asyncio.wait_for(anext(frames), 60)
        assert first.id == gen["offsets"][after_index + 1], f"replay began at {first.id}, not the next event"
        end = first
        while end.event != "message_end":
            end = await asyncio.wait_for(anext(frames), 60)
        return {"first_s": first.received - stream.opened, "end_s": end.received - stream.opened,
                "age_s": stream.opened - gen["made"]}
    finally:
        await stream.close()


def figures(rows: list[dict[str, float]]) -> dict[str, Any]:
    return {"samples": len(rows), "age_s_p50": round(common.pct([r["age_s"] for r in rows], 50), 1),
            "first_event_ms": common.summary([r["first_s"] for r in rows], 1000),
            "message_end_ms": common.summary([r["end_s"] for r in rows], 1000)}


async def run(ns: argparse.Namespace) -> dict[str, Any]:
    settings = await common.bench_settings("r")
    topic = Topics(settings.topic_prefix).tokens
    svc = common.service(settings, "bench_resume")
    redis = aioredis.Redis.from_url(settings.redis_url)
    producer = make_producer(settings.kafka_bootstrap)
    stop = asyncio.Event()
    fill: asyncio.Task[int] | None = None
    try:
        port = svc.start_gateway("gateway-a").port or 0
        users = await common.make_users(settings, "paid", 4)
        await producer.start()
        fill = asyncio.create_task(filler(producer, topic, ns.filler_rate, stop))
        old = [await generation(producer, topic, redis, users[i % 4], ns.deltas) for i in range(ns.samples)]
        ready_at = old[-1]["made"] + ns.age_s
        await resume(port, await generation(producer, topic, redis, users[0], ns.deltas), ns.resume_after)  # warm-up
        fresh = []
        for i in range(ns.samples):
            fresh.append(await resume(port, await generation(producer, topic, redis, users[i % 4], ns.deltas),
                                      ns.resume_after))
        print(f"   fresh done; waiting {max(0.0, ready_at - time.time()):.0f} s for the old set to age "
              f"{ns.age_s:.0f} s (filler appending {ns.filler_rate:.0f} events/s meanwhile)", flush=True)
        await asyncio.sleep(max(0.0, ready_at - time.time()))
        aged = [await resume(port, gen, ns.resume_after) for gen in old]
        stop.set()
        filled = await fill
        return {"deltas": ns.deltas, "resume_after": ns.resume_after, "filler_rate": ns.filler_rate,
                "filler_events": filled, "age_s": ns.age_s, "fresh": figures(fresh), "old": figures(aged)}
    finally:
        stop.set()
        if fill is not None:
            await asyncio.gather(fill, return_exceptions=True)
        await producer.stop()
        await redis.aclose()
        common.stop_service(svc)
        await common.delete_topics(settings)


async def main(ns: argparse.Namespace) -> None:
    common.header("bench_resume: reconnect with Last-Event-ID -> first replayed event",
                  engine="none (synthetic chat.tokens)", model="-", concurrency=1,
                  samples=f"{ns.samples} fresh + {ns.samples} aged", age_s=ns.age_s, filler_rate=ns.filler_rate)
    if ns.age_s < 300:
        print(f"   NOTE: the old set is {ns.age_s:.0f} s old, not 5 minutes")
    out = await run(ns)
    for name in ("fresh", "old"):
        f = out[name]
        print(f"   {name:5s} (age p50 {f['age_s_p50']:.1f} s): first replayed event p50 "
              f"{f['first_event_ms']['p50']:.1f} ms p95 {f['first_event_ms']['p95']:.1f} ms; message_end p50 "
              f"{f['message_end_ms']['p50']:.1f} ms p95 {f['message_end_ms']['p95']:.1f} ms")
    common.write_result("bench_resume", out)


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="CI-sized: 5 samples, 30 s old")
    parser.add_argument("--samples", type=int, default=None, help="per set (default 20, quick 5)")
    parser.add_argument("--age-s", type=float, default=None, help="age of the old set (default 300, quick 30)")
    parser.add_argument("--deltas", type=int, default=20, help="token events per generation")
    parser.add_argument("--resume-after", type=int, default=10, help="index of the last event the client saw")
    parser.add_argument("--filler-rate", type=float, default=200.0, help="other generations' events/s meanwhile")
    ns = parser.parse_args()
    ns.samples = ns.samples or (5 if ns.quick else 20)
    ns.age_s = ns.age_s if ns.age_s is not None else (30.0 if ns.quick else 300.0)
    ns.age_s = min(ns.age_s, 540.0)  # chat.tokens keeps 10 minutes
    return ns


if __name__ == "__main__":
    asyncio.run(main(parse()))
