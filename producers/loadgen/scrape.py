"""Figures from a process's Prometheus ``/metrics``: the worker's engine (sequences running and waiting, KV
use, prefix hits, tokens) and the stages' consumer lag. Parsing is pure; ``fetch`` is the only I/O."""
from __future__ import annotations

from collections.abc import Iterable

import httpx

Samples = dict[str, float]  # 'name{label="v",...}' or 'name' -> value


def parse(text: str, names: Iterable[str]) -> Samples:
    """The samples named (full sample names: ``_total``, ``_sum``...), labels other than ``pool`` kept in the key.

    A plain line scan: a worker's page is mostly histogram buckets nobody here reads, and a full exposition
    parser costs this process more CPU than the rest of its sampling."""
    wanted, out = tuple(names), {}
    for line in text.splitlines():
        if not line.startswith(wanted):
            continue
        head, _, value = line.rpartition(" ")
        name, _, labels = head.partition("{")
        if name not in wanted:
            continue
        pairs = sorted(p for p in labels.rstrip("}").split(",") if p and not p.startswith("pool="))
        out[f"{name}{{{','.join(pairs)}}}" if pairs else name] = float(value)
    return out


def total(samples: Samples, name: str) -> float:
    """The sum of every sample of ``name`` whatever its labels."""
    return sum(v for k, v in samples.items() if k == name or k.startswith(name + "{"))


async def fetch(http: httpx.AsyncClient, url: str, names: Iterable[str]) -> Samples:
    try:
        r = await http.get(url, timeout=3.0)
        r.raise_for_status()
    except httpx.HTTPError:
        return {}
    return parse(r.text, names)


ENGINE = ("parley_worker_running_sequences", "parley_worker_waiting_sequences", "parley_worker_kv_cache_usage_ratio",
          "parley_worker_prefix_cache_hit_ratio", "parley_worker_tokens_total", "parley_worker_prompt_tokens_total",
          "parley_worker_cached_prompt_tokens_total", "parley_worker_busy_seconds_total",
          "parley_worker_replies_total", "parley_worker_ttft_seconds_sum", "parley_worker_ttft_seconds_count",
          "parley_worker_inter_token_seconds_sum", "parley_worker_inter_token_seconds_count",
          "parley_worker_sim_cpu_seconds")
STAGES = ("parley_kafka_consumer_lag_records",)
