"""What the ``routing`` scenario measures beside the client's figures: per replica of the routed pool, the
prefix-cache hit rate over the step (cached / prompt tokens, every worker's counters) and the queue (sequences
running and waiting, sampled each second), and, where the step asks, one worker stopped mid-run (SIGTERM, the
way a scale-down leaves).
"""
from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import statistics
from collections.abc import Awaitable
from typing import Any, TypeVar

import httpx

from infra.local.loadtest_service import PrivateService
from producers.loadgen import scrape

T = TypeVar("T")
QUEUE = ("parley_worker_running_sequences", "parley_worker_waiting_sequences")
TOKENS = ("parley_worker_prompt_tokens_total", "parley_worker_cached_prompt_tokens_total")
SAMPLE_EVERY_S = 1.0


def replica_urls(svc: PrivateService, pool: str) -> dict[str, str]:
    return {name: f"http://127.0.0.1:{port}/metrics" for name, port in svc.metrics.items()
            if name.startswith(f"worker-{pool}-")}


async def _tokens(http: httpx.AsyncClient, urls: dict[str, str]) -> dict[str, tuple[float, float]]:
    out = {}
    for name, url in urls.items():
        samples = await scrape.fetch(http, url, TOKENS)
        if samples:
            out[name] = (scrape.total(samples, TOKENS[0]), scrape.total(samples, TOKENS[1]))
    return out


async def _sample_queues(http: httpx.AsyncClient, urls: dict[str, str], into: dict[str, list[float]],
                         last: dict[str, tuple[float, float]]) -> None:
    while True:
        for name, url in urls.items():
            samples = await scrape.fetch(http, url, QUEUE + TOKENS)
            if samples:  # a worker that left answers nothing: its last counters stand
                into.setdefault(name, []).append(sum(scrape.total(samples, n) for n in QUEUE))
                last[name] = (scrape.total(samples, TOKENS[0]), scrape.total(samples, TOKENS[1]))
        await asyncio.sleep(SAMPLE_EVERY_S)


async def _leave(svc: PrivateService, name: str, after_s: float) -> None:
    await asyncio.sleep(after_s)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(svc.procs[name].pid, signal.SIGTERM)
    print(f"{name} stopped {after_s:.0f} s into the step")


async def probe(svc: PrivateService, pool: str, run: Awaitable[T], leave_after_s: float | None = None
                ) -> tuple[T, dict[str, Any]]:
    """Run ``run`` (the step's load) while sampling ``pool``'s replicas; their figures beside its result."""
    urls = replica_urls(svc, pool)
    queues: dict[str, list[float]] = {}
    async with httpx.AsyncClient() as http:
        before = await _tokens(http, urls)
        last = dict(before)
        sampler = asyncio.create_task(_sample_queues(http, urls, queues, last))
        leaver = asyncio.create_task(_leave(svc, sorted(urls)[-1], leave_after_s)) if leave_after_s else None
        try:
            result = await run
        finally:
            for task in (sampler, leaver):
                if task is not None:
                    task.cancel()
        last.update(await _tokens(http, urls))
    return result, figures(before, last, queues)


def figures(before: dict[str, tuple[float, float]], after: dict[str, tuple[float, float]],
            queues: dict[str, list[float]]) -> dict[str, Any]:
    """Hit rate over the step and the max/mean of the replicas' mean queues (1.0: perfectly even)."""
    prompt = sum(after[n][0] - before.get(n, (0.0, 0.0))[0] for n in after)
    cached = sum(after[n][1] - before.get(n, (0.0, 0.0))[1] for n in after)
    means = {n: statistics.fmean(q) for n, q in queues.items() if q}
    spread = max(means.values()) / statistics.fmean(means.values()) if means and any(means.values()) else None
    return {"prefix_hit_rate": round(cached / prompt, 3) if prompt else None,
            "queue_max_over_mean": round(spread, 2) if spread is not None else None,
            "queue_mean_by_replica": {n: round(m, 1) for n, m in sorted(means.items())},
            "prompt_tokens": int(prompt)}
