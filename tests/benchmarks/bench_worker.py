"""The generation worker against the engine it wraps, on SmolLM2-135M-Instruct (CPU build, eager).

One run, one after the other (never at the same time, so neither steals the other's CPU):
1. direct: ``VllmEngine`` (AsyncLLM) in this process, at 1 and 16 concurrent requests; then closed;
2. worker: one ``parley worker --pool large`` process, requests produced as ``GenerationRequested`` into
   ``generate.large.paid``, tokens read back from ``chat.tokens``, at 1 and 16 concurrent requests;
3. prefix caching, through the same worker: a conversation's first turn (> 256 prompt tokens), its second
   turn (first prompt + reply + a question), and a cold control of the second turn's size;
4. direct again, with the worker stopped: the machine is shared, so the reference is the mean of 1 and 4.

Figures: (a) continuous batching factor = tokens/s at 16 / at 1 through the worker; (b) worker overhead =
worker / direct tokens/s (target >= 0.90) and added TTFT p50 at 1 (target <= 20 ms); (c) TTFT and
``cached_prompt_tokens`` (``GenerationStarted``) per turn. Greedy sampling, same prompts and max_tokens.

    python -m tests.benchmarks.bench_worker [--quick] [--max-tokens 64] [--single 6] [--rounds 2]
"""
from __future__ import annotations

import argparse
import asyncio
import itertools
import os
import time
import uuid
from typing import Any

from consumers.generation.engine import GREEDY
from infra.config.settings import Settings
from schemas import GenerationFinished, GenerationRequested, GenerationStarted, TokensAppended, new_id
from tests.benchmarks import common
from tests.benchmarks.common import Timeline, ratio
from topics import Topics
from topics.clients import make_producer, send

POOL_ENV = {"PARLEY_POOL_LARGE_MAX_SEQS": "16", "PARLEY_POOL_LARGE_KV_CACHE_GIB": "1"}
BATCH = 16
TIMEOUT_S = 300


class WorkerClient:
    """Requests into ``generate.large.paid``; each one's tokens as they arrive on ``chat.tokens``."""

    def __init__(self, settings: Settings) -> None:
        self.topic = Topics(settings.topic_prefix).generate("large", "paid")
        self.producer = make_producer(settings.kafka_bootstrap)
        self.tap = common.TokenTap(settings)

    async def start(self) -> None:
        await self.producer.start()
        await self.tap.start()

    async def stop(self) -> None:
        await self.tap.stop()
        await self.producer.stop()

    async def request(self, prompt: list[int], max_tokens: int) -> Timeline:
        gid = new_id()
        req = GenerationRequested(generation_id=gid, conversation_id=f"bench-{gid}", user_id="bench", plan="paid",
                                  pool="large", lane="paid", prompt_token_ids=prompt, max_tokens=max_tokens,
                                  message_id=gid, temperature=0.0)
        run = Timeline(time.time())
        await send(self.producer, self.topic, req, req.conversation_id)
        for received, _, e in await self.tap.finished(gid, TIMEOUT_S):
            if isinstance(e, TokensAppended) and e.token_ids:
                run.chunks.append((received, len(e.token_ids)))
                run.extra.setdefault("first_append_at", e.at)
            elif isinstance(e, GenerationStarted):
                run.extra.update(cached=e.cached_prompt_tokens, prompt_tokens=e.prompt_tokens)
            elif isinstance(e, GenerationFinished):
                run.done, run.tokens = received, e.usage.completion_tokens
                run.extra.update(status=e.status, text=e.text, picked_at=e.started_at,
                                 first_token_at=e.first_token_at)
        del self.tap.events[gid]
        return run


async def levels(one: Any, n_single: int, rounds: int, cpu_pids: list[int]) -> dict[str, Any]:
    await one(0)  # warm-up (first-request costs on both sides), not counted
    await one(1)
    single, runs1 = await common.measured_level(1, n_single, one, cpu_pids)
    batch, runs16 = await common.measured_level(BATCH, BATCH * rounds, one, cpu_pids)
    if "picked_at" in runs1[0].extra:
        single["hops_ms_p50"], batch["hops_ms_p50"] = hops(runs1), hops(runs16)
    return {"c1": single, f"c{BATCH}": batch}


def hops(runs: list[Timeline]) -> dict[str, float]:
    """Time to first token through the worker, by step, from the events' own timestamps (ms, p50)."""
    steps: dict[str, list[float]] = {name: [] for name in (
        "produce_to_pickup", "engine_first_token", "announce_and_append", "append_to_reader")}
    for r in runs:
        marks = [r.sent, r.extra["picked_at"], r.extra["first_token_at"], r.extra["first_append_at"], r.chunks[0][0]]
        for name, (a, b) in zip(steps, itertools.pairwise(marks), strict=True):
            steps[name].append((b - a) * 1000)
    return {name: round(common.pct(v, 50), 1) for name, v in steps.items()}


async def direct_side(pool: Any, prompts: list[list[int]], max_tokens: int, n_single: int,
                      rounds: int) -> dict[str, Any]:
    from consumers.generation.engine import VllmEngine

    engine = VllmEngine(pool)
    print(f"   direct engine loaded in {engine.load_seconds:.0f} s; effective {engine.effective}")
    try:
        return await levels(lambda i: common.engine_request(engine, prompts[i % len(prompts)], max_tokens, GREEDY),
                            n_single, rounds, [os.getpid()])
    finally:
        await engine.close()


def _notes(n: int, opener: str) -> str:
    lines = [f"Note {j}: {common.TOPICS[j % len(common.TOPICS)]} appears in chapter {j + 3}, page {7 * j + 11}."
             for j in range(n)]
    return f"{opener} Read these notes, then answer the question.\n" + "\n".join(lines) + \
        "\nQuestion: which note mentions the lighthouse keeper?"


async def prefix_side(client: WorkerClient, conversations: int, max_tokens: int) -> dict[str, Any]:
    tok = common.tokenizer()
    follow_up = "Now list every note that mentions a dragon, one per line."
    rows = []
    for _ in range(conversations):
        first = [{"role": "user", "content": _notes(24, f"Conversation {uuid.uuid4().hex}.")}]
        t1 = await client.request(tok.chat_ids(first), max_tokens)
        second = first + [{"role": "assistant", "content": t1.extra["text"]}, {"role": "user", "content": follow_up}]
        t2 = await client.request(tok.chat_ids(second), max_tokens)
        cold = [{"role": "user", "content": _notes(24, f"Conversation {uuid.uuid4().hex}.")}] + second[1:]
        t3 = await client.request(tok.chat_ids(cold), max_tokens)
        rows.append({name: {"prompt_tokens": t.extra["prompt_tokens"], "cached_prompt_tokens": t.extra["cached"],
                            "ttft_ms": round(t.ttft * 1000, 1)}
                     for name, t in (("turn1", t1), ("turn2", t2), ("turn2_cold", t3))})
    out: dict[str, Any] = {"samples": rows}
    for name in ("turn1", "turn2", "turn2_cold"):
        out[name] = {"prompt_tokens_p50": common.pct([r[name]["prompt_tokens"] for r in rows], 50),
                     "cached_prompt_tokens_p50": common.pct([r[name]["cached_prompt_tokens"] for r in rows], 50),
                     "ttft_ms": common.summary([r[name]["ttft_ms"] for r in rows])}
    return out


async def worker_side(settings: Settings, prompts: list[list[int]], max_tokens: int, n_single: int, rounds: int,
                      conversations: int) -> dict[str, Any]:
    svc = common.service(settings, "bench_worker", **POOL_ENV)
    try:
        started = time.time()
        proc = common.start_worker(svc, "large", capacity=BATCH)
        print(f"   worker process ready in {time.time() - started:.0f} s")
        client = WorkerClient(settings)
        await client.start()
        try:
            figures = await levels(lambda i: client.request(prompts[i % len(prompts)], max_tokens), n_single, rounds,
                                   [proc.popen.pid])
            figures["prefix"] = await prefix_side(client, conversations, max_tokens)
        finally:
            await client.stop()
        return figures
    finally:
        common.stop_service(svc)


def report(before: dict[str, Any], after: dict[str, Any], worker: dict[str, Any]) -> dict[str, Any]:
    """Worker against the mean of the direct runs before and after it (the machine is shared)."""
    c1, c16 = "c1", f"c{BATCH}"

    def ref(level: str, key: str) -> float:
        get = (lambda side: side[level][key]["p50"]) if key == "ttft_ms" else (lambda side: side[level][key])
        return (get(before) + get(after)) / 2

    verdict = {
        "batching_factor_worker": ratio(worker[c16]["tokens_per_s"], worker[c1]["tokens_per_s"]),
        "batching_factor_direct": ratio(ref(c16, "tokens_per_s"), ref(c1, "tokens_per_s")),
        "throughput_ratio_c16": ratio(worker[c16]["tokens_per_s"], ref(c16, "tokens_per_s")),
        "throughput_ratio_c1": ratio(worker[c1]["tokens_per_s"], ref(c1, "tokens_per_s")),
        "ttft_added_p50_ms_c1": round(worker[c1]["ttft_ms"]["p50"] - ref(c1, "ttft_ms"), 1),
        "ttft_added_p50_ms_c16": round(worker[c16]["ttft_ms"]["p50"] - ref(c16, "ttft_ms"), 1),
        "cpu_per_token_ratio_c16": ratio(worker[c16]["cpu_s_per_1k_tokens"], ref(c16, "cpu_s_per_1k_tokens")),
        "direct_drift_c16": ratio(after[c16]["tokens_per_s"], before[c16]["tokens_per_s"]),
    }
    verdict["target_throughput_met"] = verdict["throughput_ratio_c16"] >= 0.90
    verdict["target_ttft_met"] = verdict["ttft_added_p50_ms_c1"] <= 20
    print(f"   {'':14s} {'tok/s c1':>9s} {'tok/s c16':>10s} {'TTFT p50 c1':>12s} {'TTFT p50 c16':>13s} "
          f"{'ITL p95 c16':>12s} {'CPU s/1k c16':>13s} {'probe':>6s}  (ms)")
    for name, side in (("direct before", before), ("worker", worker), ("direct after", after)):
        print(f"   {name:14s} {side[c1]['tokens_per_s']:9.1f} {side[c16]['tokens_per_s']:10.1f} "
              f"{side[c1]['ttft_ms']['p50']:12.1f} {side[c16]['ttft_ms']['p50']:13.1f} "
              f"{side[c16]['itl_ms']['p95']:12.1f} {side[c16]['cpu_s_per_1k_tokens']:13.2f} "
              f"{side[c16]['cpu_probe_ms']:6.1f}")
    for level in (c1, c16):
        print(f"   worker TTFT by step, {level}, p50 ms: {worker[level].get('hops_ms_p50')}")
    for k, v in verdict.items():
        print(f"   {k}: {v}")
    p = worker["prefix"]
    for name in ("turn1", "turn2", "turn2_cold"):
        print(f"   prefix {name:10s}: prompt {p[name]['prompt_tokens_p50']:.0f} tokens, cached "
              f"{p[name]['cached_prompt_tokens_p50']:.0f}, TTFT p50 {p[name]['ttft_ms']['p50']:.1f} ms")
    return verdict


async def main(ns: argparse.Namespace) -> None:
    from infra.local.model import ready_pool as load_pool

    os.environ.update(POOL_ENV)  # the in-process engine and the worker process get the same pool
    settings = await common.bench_settings("w")
    pool = load_pool("large", settings)
    prompts = [common.tokenizer().chat_ids([{"role": "user", "content": common.story_request(i)}])
               for i in range(BATCH)]
    common.header("bench_worker: worker (Kafka in, chat.tokens out) vs AsyncLLM in-process",
                  engine="eager" if pool.enforce_eager else "compiled", model=pool.served_model_name,
                  concurrency=f"1,{BATCH}", samples=f"c1={ns.single} c{BATCH}={BATCH * ns.rounds}",
                  max_tokens=ns.max_tokens, prefix_conversations=ns.conversations, sampling="greedy")
    before = await direct_side(pool, prompts, ns.max_tokens, ns.single, ns.rounds)
    try:
        worker = await worker_side(settings, prompts, ns.max_tokens, ns.single, ns.rounds, ns.conversations)
    finally:
        await common.delete_topics(settings)
    after = await direct_side(pool, prompts, ns.max_tokens, ns.single, ns.rounds)
    verdict = report(before, after, worker)
    common.write_result("bench_worker", {
        "engine": "eager" if pool.enforce_eager else "compiled", "model": pool.served_model_name,
        "max_num_seqs": pool.max_num_seqs, "max_tokens": ns.max_tokens, "direct_before": before, "worker": worker,
        "direct_after": after,
        "verdict": verdict})


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="CI-sized: fewer requests, shorter replies")
    parser.add_argument("--max-tokens", type=int, default=None, help="reply length (default 64, quick 32)")
    parser.add_argument("--single", type=int, default=None, help="requests at concurrency 1 (default 6, quick 3)")
    parser.add_argument("--rounds", type=int, default=None, help=f"rounds of {BATCH} at concurrency {BATCH} "
                                                                  "(default 2, quick 1)")
    parser.add_argument("--conversations", type=int, default=None, help="prefix-cache samples (default 4, quick 2)")
    ns = parser.parse_args()
    ns.max_tokens = ns.max_tokens or (32 if ns.quick else 64)
    ns.single = ns.single or (3 if ns.quick else 6)
    ns.rounds = ns.rounds or (1 if ns.quick else 2)
    ns.conversations = ns.conversations or (2 if ns.quick else 4)
    return ns


if __name__ == "__main__":
    asyncio.run(main(parse()))
