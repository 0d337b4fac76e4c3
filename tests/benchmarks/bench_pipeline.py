"""The whole pipeline against the engine alone: the same prompts and max_tokens (a) straight into
``VllmEngine`` (AsyncLLM) in this process, then, with that engine closed, (b) through Parley over HTTP/SSE
(gateway -> admission -> prompt build -> scheduler -> worker -> delivery), at 1, 8 and 32 concurrent replies,
then (a) again with the service stopped: the machine is shared, so the engine alone is measured on both
sides of Parley and the mean of the two is the reference (their ratio is printed as drift). Each level also
records a CPU probe (how contended the machine was) and the CPU seconds per 1,000 tokens of the processes
doing the work (this process + its EngineCore for (a); gateway, stages, worker + EngineCore for (b)).

Prompts are exactly what the prompt stage builds for a new conversation's first turn (shared system prompt
+ the message); sampling is the pipeline's default for replies (temperature 0.7, top_p 0.95). Paid users,
limits from ``tests/benchmarks/plans.toml`` (the reply cap is max_tokens), large pool at 32 sequences.
Per request, the event timestamps on every topic split the time to first token by hop. At concurrency 1
each reply is followed by a pause (``--think-s``, both sides), so a request's time to first token is not
spent behind the previous reply's tail work (persistence, settlement) on this 2-core machine.

Targets: (b)/(a) tokens/s >= 0.90 at 32; TTFT added at 1 stream <= 25 ms p50.

    python -m tests.benchmarks.bench_pipeline [--quick] [--max-tokens 64] [--levels 1,8,32] [--think-s 0.5]
                                              [--with-small] [--profile]
"""
from __future__ import annotations

import argparse
import asyncio
import itertools
import os
import time
from typing import Any

import httpx

from consumers.generation.engine import Sampling
from infra.config.settings import Settings
from schemas import GenerationFinished, GenerationStarted
from tests.benchmarks import common
from tests.benchmarks.common import Timeline, ratio
from tests.benchmarks.profiling import Profiler, cpu_seconds, tree_cpu
from tests.benchmarks.sse_client import HttpError, SseStream
from topics import Topics

POOL_ENV = {"PARLEY_POOL_LARGE_MAX_SEQS": "32", "PARLEY_POOL_LARGE_KV_CACHE_GIB": "1"}
REPLY_SAMPLING = Sampling(temperature=0.7, top_p=0.95)  # what the worker uses for a reply (GenerationRequested)
HOPS = ("gateway", "admission", "prompt", "scheduler", "worker_pickup", "engine_first_token", "worker_append",
        "delivery")


def requests_at(concurrency: int, quick: bool) -> int:
    return {1: 4 if quick else 10}.get(concurrency, concurrency * (1 if quick else 2))


# -- (a) the engine alone ----------------------------------------------------------------------------------
async def engine_side(pool: Any, prompts: list[list[int]], max_tokens: int, levels: list[int],
                      quick: bool, think_s: float) -> dict[str, Any]:
    from consumers.generation.engine import VllmEngine

    engine = VllmEngine(pool)
    print(f"   engine loaded in {engine.load_seconds:.0f} s; effective {engine.effective}")

    def one(i: int) -> Any:
        return common.engine_request(engine, prompts[i % len(prompts)], max_tokens, REPLY_SAMPLING)

    try:
        for i in range(2):
            await one(i)  # warm-up, not counted
        out = {}
        for c in levels:
            out[f"c{c}"], _ = await common.measured_level(c, requests_at(c, quick), one, [os.getpid()],
                                                          think_s if c == 1 else 0.0)
        return out
    finally:
        await engine.close()


# -- (b) through Parley ----------------------------------------------------------------------------------
class Pipeline:
    def __init__(self, settings: Settings, port: int, users: list[common.User]) -> None:
        topics = Topics(settings.topic_prefix)
        self.port, self.users = port, users
        self.tap = common.TokenTap(settings, [topics.requests, topics.admitted, topics.prompts,
                                              topics.generate("large", "paid")])
        self.http = httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=60)

    async def conversations(self, n: int) -> list[str]:
        async def one(i: int) -> str:
            r = await self.http.post("/v1/conversations", headers=self._auth(i))
            r.raise_for_status()
            return str(r.json()["conversation_id"])
        return list(await asyncio.gather(*[one(i) for i in range(n)]))

    def _auth(self, i: int) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.users[i % len(self.users)].token}"}

    async def message(self, i: int, conversation: str, content: str) -> Timeline:
        stream = SseStream(self.port, "POST", f"/v1/conversations/{conversation}/messages",
                           self.users[i % len(self.users)].token, body={"content": content})
        try:
            await stream.open()
            run = Timeline(stream.opened)
            async for f in stream.frames():
                if f.event == "message_start":
                    run.extra["gid"] = f.data["generation_id"]
                elif f.event == "delta":
                    run.chunks.append((f.received, 1))
                elif f.event == "message_end":
                    run.tokens, run.extra["stop_reason"] = f.data["usage"]["out"], f.data["stop_reason"]
                    break
                elif f.event == "error":
                    raise HttpError(500, repr(f.data).encode())
            run.done = time.time()
            return run
        finally:
            await stream.close()

    async def level(self, c: int, n: int, cpu_pids: list[int],
                    think_s: float = 0.0) -> tuple[dict[str, Any], list[Timeline]]:
        convs = await self.conversations(n)
        return await common.measured_level(c, n, lambda i: self.message(i, convs[i], common.story_request(i)),
                                           cpu_pids, think_s)

    def hops(self, run: Timeline) -> dict[str, float] | None:
        """Where this request's time to first token went, from each event's own timestamp (ms)."""
        first = {name: e for name, (_, e) in common.firsts(self.tap.events.get(run.extra.get("gid", ""), [])).items()}
        need = ("MessageSubmitted", "RequestAdmitted", "PromptBuilt", "GenerationRequested", "GenerationStarted",
                "TokensAppended", "GenerationFinished")
        if not run.chunks or not all(k in first for k in need):
            return None
        fin: GenerationFinished = first["GenerationFinished"]
        started: GenerationStarted = first["GenerationStarted"]
        marks = [run.sent, first["MessageSubmitted"].at, first["RequestAdmitted"].at, first["PromptBuilt"].at,
                 first["GenerationRequested"].at, fin.started_at, started.first_token_at,
                 first["TokensAppended"].at, run.chunks[0][0]]
        return {hop: (b - a) * 1000 for hop, (a, b) in zip(HOPS, itertools.pairwise(marks), strict=True)}


async def idle_cpu(svc: Any, seconds: float = 5.0) -> dict[str, dict[str, float]]:
    """What each service process (and, apart, its children: vLLM's EngineCore) burns with no request in
    flight, over ``seconds``, as a share of one core: polling loops."""
    def sample() -> dict[str, tuple[float, float]]:
        return {n: (cpu_seconds(p.popen.pid), tree_cpu([p.popen.pid])) for n, p in svc.procs.items()}

    before = sample()
    await asyncio.sleep(seconds)
    after = sample()
    return {n: {"self": round(max(0.0, after[n][0] - before[n][0]) / seconds, 3),
                "children": round(max(0.0, after[n][1] - after[n][0] - before[n][1] + before[n][0]) / seconds, 3)}
            for n in before}


async def profile_pass(svc: Any, pipe: Pipeline, levels: list[int], quick: bool) -> dict[str, Any]:
    """Unmeasured repeats of the lowest and highest level with py-spy on gateway, stages and worker."""
    pids = {name: svc.procs[name].popen.pid for name in ("gateway-a", "stages", "worker-large")}
    out = {}
    for c in sorted({min(levels), max(levels)}):
        profiler = Profiler(pids, common.RESULTS / "profiles", f"c{c}")
        if not profiler.start():
            return {}
        await pipe.level(c, requests_at(c, quick), [])
        out[f"c{c}"] = profiler.stop()
        for name, prof in out[f"c{c}"].items():
            print(f"   profile c={c} {name}: busy {prof.get('busy_share_of_one_core')} of a core; by project frame "
                  f" {prof.get('by_owner', [])[:5]}")
    return out


async def pipeline_side(settings: Settings, levels: list[int], quick: bool, env: dict[str, str],
                        with_small: bool, profile: bool, think_s: float) -> dict[str, Any]:
    svc = common.service(settings, "bench_pipeline", **env)
    try:
        started = time.time()
        common.start_pipeline(svc, with_small=with_small)
        print(f"   service ready in {time.time() - started:.0f} s (stages, gateway, worker-large"
              f"{', worker-small' if with_small else ''})")
        # Eight users: at 32 at once each has 4 streams open, under the gateway's 8 per user and server (a stream
        # still closing as its lane's next one opens would make 4 users' 8 each a 429).
        pipe = Pipeline(settings, svc.procs["gateway-a"].port or 0, await common.make_users(settings, "paid", 8))
        pids = [p.popen.pid for p in svc.procs.values()]
        await pipe.tap.start()
        try:
            await pipe.level(1, 2, [])  # warm-up, not counted
            out: dict[str, Any] = {"idle_cpu_share_of_one_core": await idle_cpu(svc)}
            print(f"   idle CPU of the service processes (share of one core): {out['idle_cpu_share_of_one_core']}")
            for c in levels:
                out[f"c{c}"], runs = await pipe.level(c, requests_at(c, quick), pids, think_s if c == 1 else 0.0)
                hops = [h for h in map(pipe.hops, runs) if h is not None]
                out[f"c{c}"]["hops_ms_p50"] = {k: round(common.pct([h[k] for h in hops], 50), 1) for k in HOPS}
                out[f"c{c}"]["stop_reasons"] = sorted({str(r.extra.get("stop_reason")) for r in runs})
                pipe.tap.events.clear()
            if profile:
                out["profile"] = await profile_pass(svc, pipe, levels, quick)
        finally:
            await pipe.tap.stop()
            await pipe.http.aclose()
        return out
    finally:
        common.stop_service(svc)


def reference(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    """The engine alone, measured before and after Parley: the mean of the two is the reference."""
    ref = {}
    for level, a in before.items():
        b = after[level]
        ref[level] = {"tokens_per_s": round((a["tokens_per_s"] + b["tokens_per_s"]) / 2, 1),
                      "ttft_ms_p50": round((a["ttft_ms"]["p50"] + b["ttft_ms"]["p50"]) / 2, 1),
                      "cpu_s_per_1k_tokens": round((a["cpu_s_per_1k_tokens"] + b["cpu_s_per_1k_tokens"]) / 2, 2),
                      "drift_after_vs_before": ratio(b["tokens_per_s"], a["tokens_per_s"])}
    return ref


def report(before: dict[str, Any], after: dict[str, Any], pipe: dict[str, Any], levels: list[int]) -> dict[str, Any]:
    ref = reference(before, after)
    print(f"   {'':5s} {'side':13s} {'tok/s':>7s} {'TTFT p50':>9s} {'TTFT p95':>9s} {'ITL p95':>8s} "
          f"{'CPU s/1k tok':>13s} {'probe':>6s}  (ms)")
    verdict: dict[str, Any] = {}
    for c in levels:
        b = pipe[f"c{c}"]
        verdict[f"throughput_ratio_c{c}"] = ratio(b["tokens_per_s"], ref[f"c{c}"]["tokens_per_s"])
        verdict[f"ttft_added_p50_ms_c{c}"] = round(b["ttft_ms"]["p50"] - ref[f"c{c}"]["ttft_ms_p50"], 1)
        verdict[f"cpu_per_token_ratio_c{c}"] = ratio(b["cpu_s_per_1k_tokens"], ref[f"c{c}"]["cpu_s_per_1k_tokens"])
        verdict[f"engine_drift_c{c}"] = ref[f"c{c}"]["drift_after_vs_before"]
        for name, side in (("engine before", before[f"c{c}"]), ("parley", b), ("engine after", after[f"c{c}"])):
            print(f"   c={c:<3d} {name:13s} {side['tokens_per_s']:7.1f} {side['ttft_ms']['p50']:9.1f} "
                  f"{side['ttft_ms']['p95']:9.1f} {side['itl_ms']['p95']:8.1f} {side['cpu_s_per_1k_tokens']:13.2f} "
                  f"{side['cpu_probe_ms']:6.1f}")
        print("         hops p50 (ms): " + ", ".join(f"{k} {v}" for k, v in b["hops_ms_p50"].items()))
    top = max(levels)
    verdict["target_throughput_met"] = verdict.get(f"throughput_ratio_c{top}", 0) >= 0.90
    verdict["target_ttft_met"] = verdict.get("ttft_added_p50_ms_c1", 1e9) <= 25
    for k, v in verdict.items():
        print(f"   {k}: {v}")
    return {"reference": ref, **verdict}


async def main(ns: argparse.Namespace) -> None:
    from infra.local.model import ready_pool as load_pool

    env = dict(POOL_ENV, PARLEY_PLANS_FILE=str(common.plans_file(ns.max_tokens)))
    os.environ.update(env)  # the in-process engine and the service get the same pool and plans
    settings = await common.bench_settings("p")
    pool = load_pool("large", settings)
    prompts = [common.pipeline_prompt(common.story_request(i)) for i in range(len(common.TOPICS))]
    common.header("bench_pipeline: Parley over HTTP/SSE vs AsyncLLM in-process",
                  engine="eager" if pool.enforce_eager else "compiled", model=pool.served_model_name,
                  concurrency=",".join(map(str, ns.levels)),
                  samples=",".join(f"c{c}={requests_at(c, ns.quick)}" for c in ns.levels),
                  max_tokens=ns.max_tokens, max_num_seqs=pool.max_num_seqs, sampling="t=0.7 top_p=0.95",
                  think_s_at_c1=ns.think_s)
    before = await engine_side(pool, prompts, ns.max_tokens, ns.levels, ns.quick, ns.think_s)
    try:
        pipe = await pipeline_side(settings, ns.levels, ns.quick, env, ns.with_small, ns.profile, ns.think_s)
    finally:
        await common.delete_topics(settings)
    after = await engine_side(pool, prompts, ns.max_tokens, ns.levels, ns.quick, ns.think_s)
    verdict = report(before, after, pipe, ns.levels)
    common.write_result("bench_pipeline", {
        "engine": "eager" if pool.enforce_eager else "compiled", "model": pool.served_model_name,
        "max_num_seqs": pool.max_num_seqs, "max_tokens": ns.max_tokens, "with_small_worker": ns.with_small,
        "engine_alone_before": before, "engine_alone_after": after, "parley": pipe, "verdict": verdict})


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="CI-sized: fewer requests, shorter replies")
    parser.add_argument("--max-tokens", type=int, default=None, help="reply cap (default 64, quick 32)")
    parser.add_argument("--levels", default="1,8,32", help="concurrent replies, comma-separated")
    parser.add_argument("--with-small", action="store_true",
                        help="also run the small-pool worker (titles); off by default: it competes for the CPU")
    parser.add_argument("--think-s", type=float, default=0.5,
                        help="pause after each reply at concurrency 1, both sides (left out of tokens/s)")
    parser.add_argument("--profile", action="store_true",
                        help="afterwards, repeat the lowest and highest level under py-spy (not measured)")
    ns = parser.parse_args()
    ns.max_tokens = ns.max_tokens or (32 if ns.quick else 64)
    ns.levels = [int(x) for x in ns.levels.split(",")]
    return ns


if __name__ == "__main__":
    asyncio.run(main(parse()))
