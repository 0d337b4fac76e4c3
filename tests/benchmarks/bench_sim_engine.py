"""What the simulated engine costs in CPU of its own, per token, beside the step time it models.

The sim engine must cost next to nothing per token, or a load test would measure the simulator instead of
the pipeline. Two figures, in one run on a word tokenizer (no model needed):
- ``core``: ``SimCore.step`` alone at a full batch (183 sequences of ~2,500 tokens, the seeds' replica),
  thread CPU per token, beside the modelled step (36 ms) and the tokens/s it models;
- ``engine``: the asyncio transport too (queues, StepOutputs, the consumer's ``async for``), with steps of
  ~zero modelled time so the run is CPU-bound: CPU per token delivered.
The ratio printed is the simulator's CPU per token over the pipeline's budget per token (0.05 ms).

    python -m tests.benchmarks.bench_sim_engine [--seqs 183] [--steps 200]
"""
from __future__ import annotations

import argparse
import asyncio
import time

from consumers.generation.sampling import Sampling
from consumers.generation.sim_core import SimCore
from consumers.generation.sim_engine import SimEngine
from infra.config.pools import PoolConfig, SimConfig
from tests.fakes import FakeTokenizer

BUDGET_MS_PER_TOKEN = 0.05  # the pipeline's whole CPU budget per token (ARCHITECTURE.md)


def core_figures(seqs: int, steps: int) -> dict[str, float]:
    core = SimCore(SimConfig(), max_num_seqs=256, max_num_batched_tokens=1 << 20)
    for i in range(seqs):
        core.add(f"s{i}", list(range(i * 10_000, i * 10_000 + 2440)), [7] * (steps + 10), "stop")
    while any(s.computed < len(s.prompt) for s in core.running) or core.waiting:
        core.step()
    cpu, tokens, modelled = time.thread_time(), 0, 0.0
    for _ in range(steps):
        result = core.step()
        tokens += sum(len(o.token_ids) for o in result.outputs)
        modelled += result.duration_s
    cpu = time.thread_time() - cpu
    return {"tokens": tokens, "cpu_ms_per_token": cpu * 1000 / tokens, "step_ms": modelled * 1000 / steps,
            "modelled_tok_s": tokens / modelled}


async def engine_figures(seqs: int, reply: int) -> dict[str, float]:
    pool = PoolConfig(name="sim", model_dir="/nowhere", uses_default_model=False, served_model_name="sim",
                      max_num_seqs=256, max_model_len=8192, max_num_batched_tokens=1 << 16, engine="sim",
                      sim=SimConfig(hbm_tb_per_s=1e9, reply_tokens=reply))
    engine = SimEngine(pool, FakeTokenizer())

    async def one(i: int) -> int:
        got = 0
        async for out in engine.generate(f"r{i}", [i, i + 1, i + 2], reply * 2, 0, Sampling(ignore_eos=True)):
            got += len(out.token_ids)
        return got

    cpu = time.process_time()
    tokens = sum(await asyncio.gather(*(one(i) for i in range(seqs))))
    cpu = time.process_time() - cpu
    await engine.close()
    return {"tokens": tokens, "cpu_ms_per_token": cpu * 1000 / tokens,
            "engine_own_ms_per_token": engine.cpu_seconds * 1000 / tokens}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seqs", type=int, default=183)
    parser.add_argument("--steps", type=int, default=200)
    args = parser.parse_args()
    core = core_figures(args.seqs, args.steps)
    engine = asyncio.run(engine_figures(args.seqs, args.steps))
    print(f"sim engine, {args.seqs} sequences x {args.steps} steps")
    print(f"  core:   {core['cpu_ms_per_token'] * 1000:7.2f} µs CPU per token   modelled step {core['step_ms']:.1f} ms"
          f" -> {core['modelled_tok_s']:,.0f} tok/s   ({core['cpu_ms_per_token'] / BUDGET_MS_PER_TOKEN:.2f}x the"
          f" pipeline's 0.05 ms budget)")
    print(f"  engine: {engine['cpu_ms_per_token'] * 1000:7.2f} µs CPU per token delivered through the transport"
          f" and its consumers, {engine['engine_own_ms_per_token'] * 1000:.2f} µs of it counted as the engine's own"
          f"   ({engine['cpu_ms_per_token'] / BUDGET_MS_PER_TOKEN:.2f}x the budget)")


if __name__ == "__main__":
    main()
