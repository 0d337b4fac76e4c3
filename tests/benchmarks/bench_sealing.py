"""What sealing costs: the generation worker with and without per-conversation encryption, in one run.

One in-process vLLM engine (SmolLM2-135M-Instruct, CPU build) is shared by two in-process workers that
take turns (never at the same time): ``sealed`` opens each prompt and seals every token event with the
conversation's data key, and the reader opens each token event as the gateway would; ``plain`` does
neither. Rounds alternate (plain, sealed, plain, sealed, ...) so the machine's drift hits both sides.
Figures per side: TTFT (request produced -> first token event read) and tokens/s at 1 and 4 concurrent.
Also: the cost of one seal + open of a 1,000-token prompt and of a token event, in microseconds.

    python -m tests.benchmarks.bench_sealing [--requests 6] [--max-tokens 48] [--rounds 2]
"""
from __future__ import annotations

import argparse
import asyncio
import os
import time
from typing import Any

from consumers.generation.decisions import Limits
from consumers.generation.worker import GenerationWorker
from infra.stores.sealing import Sealer, configured
from infra.stores.session import AsyncSession, connect
from schemas import GenerationFinished, GenerationRequested, TokensAppended, new_id
from tests.benchmarks import common
from tests.benchmarks.common import Timeline
from topics import Topics
from topics.clients import make_producer, send

POOL_ENV = {"PARLEY_POOL_LARGE_MAX_SEQS": "8", "PARLEY_POOL_LARGE_KV_CACHE_GIB": "1"}


async def one_side(settings: Any, engine: Any, pool: Any, sealer: Sealer | None, prompts: list[list[int]],
                   max_tokens: int, requests: int, concurrency: int) -> dict[str, Any]:
    limits = Limits("large", pool.served_model_name, pool.max_model_len)
    worker = GenerationWorker(settings, limits, engine, 8, sealer=sealer)
    ready = asyncio.Event()
    worker.on_ready = lambda _: ready.set()
    task = asyncio.create_task(worker.run())
    producer, tap = make_producer(settings.kafka_bootstrap), common.TokenTap(settings)
    await producer.start()
    await tap.start()
    topic = Topics(settings.topic_prefix).generate("large", "paid")

    async def request(i: int) -> Timeline:
        gid = new_id()
        cid = f"bench-{gid}"
        req = GenerationRequested(generation_id=gid, conversation_id=cid, user_id="bench", plan="paid", pool="large",
                                  lane="paid", prompt_token_ids=prompts[i % len(prompts)], max_tokens=max_tokens,
                                  message_id=gid, temperature=0.0)
        if sealer is not None:
            await sealer.keys.create(cid, "bench")  # what the gateway does when the conversation is made
            req = await sealer.seal(req)
        run = Timeline(time.time())
        await send(producer, topic, req, cid)
        for received, _, e in await tap.finished(gid, 300):
            if isinstance(e, TokensAppended):
                began = time.perf_counter()
                e = await sealer.open(e) if sealer else e  # the gateway's relay opens every token event
                run.chunks.append((received + time.perf_counter() - began, len(e.token_ids)))
            elif isinstance(e, GenerationFinished):
                run.done, run.tokens = received, e.usage.completion_tokens
        return run

    try:
        await asyncio.wait_for(ready.wait(), 120)
        await asyncio.sleep(3)  # the group's first assignment
        await request(0)  # warm-up
        runs, wall = await common.closed_loop(concurrency, requests, request)
        return common.side_figures(runs, wall)
    finally:
        worker.stop()
        await asyncio.wait_for(task, 60)
        await tap.stop()
        await producer.stop()


async def unit_costs(sealer: Sealer) -> dict[str, float]:
    await sealer.keys.create("bench-unit", "bench")
    prompt = GenerationRequested(generation_id="g", conversation_id="bench-unit", user_id="b", plan="paid",
                                 pool="large", lane="paid", prompt_token_ids=list(range(1000)), max_tokens=1)
    token = TokensAppended(generation_id="g", conversation_id="bench-unit", user_id="b", seq=1, text=" word",
                           token_ids=[1234])
    out = {}
    for name, event in (("prompt_1000_tokens_us", prompt), ("token_event_us", token)):
        n, began = 2000, time.perf_counter()
        for _ in range(n):
            await sealer.open(await sealer.seal(event))
        out[name] = round((time.perf_counter() - began) / n * 1e6, 1)
    return out


async def main(args: argparse.Namespace) -> None:
    from consumers.generation.engine import VllmEngine
    from infra.local.model import ready_pool

    os.environ.update(POOL_ENV)
    settings = await common.bench_settings("seal")
    cluster, session = connect(settings)
    sealer = configured(settings, AsyncSession(session))
    pool = ready_pool("large", settings)
    prompts = [common.pipeline_prompt(common.story_request(i)) for i in range(8)]
    common.header("sealing overhead through the worker", model=pool.served_model_name, requests=args.requests,
                  max_tokens=args.max_tokens, rounds=args.rounds, prompt_tokens=len(prompts[0]))
    engine = VllmEngine(pool)
    results: dict[str, Any] = {"unit_costs": await unit_costs(sealer), "rounds": []}
    try:
        for r in range(args.rounds):
            row = {}
            for concurrency in (1, 4):
                for side in ("plain", "sealed"):
                    figures = await one_side(settings, engine, pool, sealer if side == "sealed" else None, prompts,
                                             args.max_tokens, args.requests, concurrency)
                    row[f"{side}_c{concurrency}"] = figures
                    print(f"   round {r} c={concurrency} {side:6s}: TTFT p50 {figures['ttft_ms']['p50']:.1f} ms, "
                          f"{figures['tokens_per_s']:.1f} tokens/s")
            results["rounds"].append(row)
    finally:
        await engine.close()
        cluster.shutdown()
    print(f"   seal+open: {results['unit_costs']}")
    common.write_result("bench_sealing", results)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=6)
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--rounds", type=int, default=2)
    asyncio.run(main(parser.parse_args()))
