"""Clean traffic with the output check off, on with hold-back 0, and on with one sentence held back:
time to first token and tokens/s, side by side in one run, through one real worker (SmolLM2-135M, CPU).

One ``parley worker --pool large`` process serves every mode: its rules file is rewritten between
rounds (the worker re-reads it on change, so nothing restarts and the engine stays warm). The modes
take turns round by round, so drift in the shared machine's load falls on all three alike. Replies
are stories nobody flags; greedy, so each mode generates the same tokens. Also prints the classifier
time per chunk from the worker's own metrics, and the input check's time on this machine.

    python -m tests.benchmarks.bench_safety [--rounds 3] [--concurrency 1] [--max-tokens 96]
"""
from __future__ import annotations

import argparse
import asyncio
import time
from typing import Any

import httpx

from consumers.safety.classifier import EmbeddedClassifier
from infra.config.safety import DEFAULT_FILE, RulesFile
from tests.benchmarks import common
from tests.benchmarks.bench_worker import POOL_ENV, WorkerClient
from tests.e2e.service import free_port

MODES = {  # the paid plan's policy in each mode (the client sends paid requests)
    "off": "output_check = false",
    "hold-back 0": "output_check = true\nhold_back_sentences = 0",
    "hold-back 1 sentence": "output_check = true\nhold_back_sentences = 1",
}
RULES = common.RESULTS / "bench-safety-rules.toml"


def rules_text(mode: str, version: int) -> str:
    return (f'version = "bench-{version}"\n[model]\ninput_threshold = 0.9\noutput_threshold = 0.9\n'
            f'[[rules]]\ncategory = "weapons"\nregex = "pipe bomb"\n[plans.paid]\n{MODES[mode]}\nchunk_tokens = 24\n')


async def switch(proc: Any, client: Any, prompt: list[int], mode: str, version: int) -> None:
    """Rewrite the rules and wait until the worker says it re-read them. The worker looks at the file when a
    request consults the rules, so one-token requests (not counted) are sent until it has."""
    RULES.write_text(rules_text(mode, version))
    needle = f"-> bench-{version}"
    deadline = time.time() + 60
    while needle not in proc.log.read_text(errors="replace"):
        if time.time() > deadline:
            raise TimeoutError(f"the worker did not reload the rules for {mode!r}")
        await client.request(prompt, 1)
        await asyncio.sleep(0.5)


def per_request_rate(run: common.Timeline) -> float:
    span = run.done - run.chunks[0][0] if run.chunks else 0
    return run.tokens / span if span > 0 else float("nan")


async def classifier_seconds(port: int) -> dict[str, float]:
    """The worker's own histogram of classifier time per output chunk."""
    text = (await httpx.AsyncClient().get(f"http://127.0.0.1:{port}/metrics")).text
    values = {}
    for line in text.splitlines():
        if line.startswith("parley_safety_classifier_seconds_") and 'check="output"' in line:
            name = line.split("{")[0].removeprefix("parley_safety_classifier_seconds_")
            if name in ("sum", "count"):
                values[name] = float(line.rsplit(" ", 1)[1])
    return values


def input_check_ms(samples: int = 200) -> dict[str, float]:
    classifier = EmbeddedClassifier(RulesFile(DEFAULT_FILE))
    message = "Can you explain how tides work, and why there are two of them a day? Keep it short please."
    classifier.score_now(message, "input")
    return common.summary([classifier.score_now(message, "input").seconds for _ in range(samples)], 1000)


async def main(ns: argparse.Namespace) -> None:
    settings = await common.bench_settings("safety")
    common.header("bench_safety: output check off vs hold-back 0 vs one sentence, one worker",
                  model="SmolLM2-135M-Instruct", engine="vLLM CPU eager", rounds=ns.rounds,
                  concurrency=ns.concurrency, max_tokens=ns.max_tokens)
    prompts = [common.pipeline_prompt(common.story_request(i)) for i in range(8)]
    RULES.parent.mkdir(exist_ok=True)
    RULES.write_text(rules_text("off", 0))
    port = free_port()
    svc = common.service(settings, "bench_safety", PARLEY_SAFETY_FILE=str(RULES), **POOL_ENV)
    runs: dict[str, list[common.Timeline]] = {m: [] for m in MODES}
    chunk_ms: dict[str, float] = {}
    try:
        svc.start("worker-large", "worker", "--pool", "large", "--metrics-port", str(port))
        proc = svc.procs["worker-large"]
        svc.wait_log(proc, "worker ready", 600)
        client = WorkerClient(settings)
        await client.start()
        try:
            await client.request(prompts[0], 16)  # warm-up, not counted
            version = 0
            for r in range(ns.rounds):
                for mode in MODES:
                    version += 1
                    await switch(proc, client, prompts[0], mode, version)
                    before = await classifier_seconds(port)
                    batch, _ = await common.closed_loop(ns.concurrency, ns.concurrency, lambda i, r=r: client.request(
                        prompts[(r * ns.concurrency + i) % len(prompts)], ns.max_tokens))
                    runs[mode] += batch
                    after = await classifier_seconds(port)
                    if after.get("count", 0) > before.get("count", 0):
                        chunk_ms.setdefault("sum", 0.0)
                        chunk_ms["sum"] += after["sum"] - before.get("sum", 0.0)
                        chunk_ms["count"] = chunk_ms.get("count", 0) + after["count"] - before.get("count", 0)
        finally:
            await client.stop()
    finally:
        common.stop_service(svc)
    rows = {mode: {"requests": len(rs), "statuses": sorted({r.extra.get("status") for r in rs}),
                   "ttft_ms": common.summary([r.ttft for r in rs], 1000),
                   "tokens_per_s_per_request": common.summary([per_request_rate(r) for r in rs])}
            for mode, rs in runs.items()}
    base = rows["off"]["ttft_ms"]["p50"]
    print(f"   {'mode':<22} {'n':>3} {'TTFT p50':>10} {'TTFT p95':>10} {'added p50':>10} {'tok/s p50':>10}")
    for mode, row in rows.items():
        ttft, rate = row["ttft_ms"], row["tokens_per_s_per_request"]
        print(f"   {mode:<22} {row['requests']:>3} {ttft['p50']:>8.1f}ms {ttft['p95']:>8.1f}ms "
              f"{ttft['p50'] - base:>8.1f}ms {rate['p50']:>10.1f}   {row['statuses']}")
    per_chunk = 1000 * chunk_ms["sum"] / chunk_ms["count"] if chunk_ms.get("count") else float("nan")
    inputs = input_check_ms()
    chunks = chunk_ms.get("count", 0)
    print(f"   output classifier per chunk (worker metrics): mean {per_chunk:.2f} ms over {chunks:.0f} chunks;"
          f" input check here: p50 {inputs['p50']:.2f} ms, p95 {inputs['p95']:.2f} ms")
    common.write_result("bench_safety", {"modes": rows, "output_chunk_ms_mean": round(per_chunk, 3),
                                         "output_chunks": chunk_ms.get("count", 0), "input_check_ms": inputs,
                                         "rounds": ns.rounds, "concurrency": ns.concurrency,
                                         "max_tokens": ns.max_tokens})


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3, help="turns of all three modes")
    parser.add_argument("--concurrency", type=int, default=1, help="requests at once in each turn")
    parser.add_argument("--max-tokens", type=int, default=96)
    return parser.parse_args()


if __name__ == "__main__":
    asyncio.run(main(parse()))
