"""Prometheus metrics of one generation worker (one registry per worker, served on the pool's fixed port).

The seed's watch list, from the replica's side: queue time (scheduler's enqueue -> picked up) by lane, KV-cache
use, prefix-cache hits (cached / total prompt tokens, as counters so any window's rate can be taken), tokens
made, and busy time priced at the configured $/GPU-hour: the cost of replies is what the busy replicas cost,
divided by the replies they made (``sum(rate(parley_worker_cost_usd_total)) / sum(rate(parley_worker_replies_total))``).
"""
from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from schemas.scheduler import LANES

_LAT = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)
# Queueing is seconds, not milliseconds: the free plan's wait limit is 10 s.
_QUEUE = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 60)


class WorkerMetrics:
    def __init__(self, pool: str, gpu_hour_usd: float = 2.50, gpus: int = 1) -> None:
        self.registry = r = CollectorRegistry()
        self.pool = pool
        p = {"pool": pool}
        self.ttft = Histogram("parley_worker_ttft_seconds", "request picked up to first token", ["pool"],
                              buckets=_LAT, registry=r).labels(**p)
        self.itl = Histogram("parley_worker_inter_token_seconds", "time between token appends per sequence",
                             ["pool"], buckets=_LAT, registry=r).labels(**p)
        self.queue_time = Histogram("parley_worker_queue_seconds", "scheduler's enqueue to the worker's pick-up",
                                    ["pool", "lane"], buckets=_QUEUE, registry=r)
        self.tokens = Counter("parley_worker_tokens", "completion tokens generated", ["pool"], registry=r).labels(**p)
        self.lane_tokens = Counter("parley_worker_completion_tokens", "completion tokens generated, by lane",
                                   ["pool", "lane"], registry=r)
        self.replies = Counter("parley_worker_replies", "generations finished, by status", ["pool", "status"],
                               registry=r)
        self.running = Gauge("parley_worker_running_sequences", "sequences in the engine", ["pool"],
                             registry=r).labels(**p)
        self.waiting = Gauge("parley_worker_waiting_sequences", "sequences waiting in the engine", ["pool"],
                             registry=r).labels(**p)
        self.kv_usage = Gauge("parley_worker_kv_cache_usage_ratio", "fraction of KV cache blocks in use", ["pool"],
                              registry=r).labels(**p)
        self.prefix_hit_rate = Gauge("parley_worker_prefix_cache_hit_ratio", "cached / total prompt tokens since start",
                                     ["pool"], registry=r).labels(**p)
        self.prompt_tokens_total = Counter("parley_worker_prompt_tokens", "prompt tokens of started generations",
                                           ["pool"], registry=r).labels(**p)
        self.cached_tokens_total = Counter("parley_worker_cached_prompt_tokens",
                                           "prompt tokens served from the prefix cache", ["pool"],
                                           registry=r).labels(**p)
        self.busy = Counter("parley_worker_busy_seconds", "time with at least one sequence in the engine", ["pool"],
                            registry=r).labels(**p)
        self.cost = Counter("parley_worker_cost_usd", "busy time priced at the configured $/GPU-hour", ["pool"],
                            registry=r).labels(**p)
        Gauge("parley_worker_gpu_hour_usd", "the configured price of one GPU-hour", ["pool"],
              registry=r).labels(**p).set(gpu_hour_usd)
        self.aborts = Counter("parley_worker_aborts", "generations stopped by a cancel", ["pool"],
                              registry=r).labels(**p)
        self.recoveries = Counter("parley_worker_recoveries", "generations continued from saved tokens",
                                  ["pool"], registry=r).labels(**p)
        self.store_waits = Counter("parley_worker_store_waits", "retries of a request paused by a store or "
                                   "Kafka outage", ["pool"], registry=r).labels(**p)
        self.failures = Counter("parley_worker_failures", "generations that ended failed", ["pool"],
                                registry=r).labels(**p)
        for lane in LANES:  # exported at 0 from the start, so the first request's increase is seen by rate()
            self.queue_time.labels(pool=pool, lane=lane)
            self.lane_tokens.labels(pool=pool, lane=lane)
        self._sim: dict[str, Gauge] = {}
        self._usd_per_s = gpu_hour_usd * gpus / 3600
        self._busy_since: float | None = None
        self.prompt_tokens = 0
        self.cached_prompt_tokens = 0

    def prompt_seen(self, prompt_tokens: int, cached: int) -> None:
        self.prompt_tokens += prompt_tokens
        self.cached_prompt_tokens += cached
        self.prompt_tokens_total.inc(prompt_tokens)
        self.cached_tokens_total.inc(cached)
        if self.prompt_tokens:
            self.prefix_hit_rate.set(self.cached_prompt_tokens / self.prompt_tokens)

    def picked(self, lane: str, enqueued_at: float, now: float) -> None:
        if enqueued_at > 0:  # 0: a request from before the scheduler stamped it
            self.queue_time.labels(pool=self.pool, lane=lane).observe(max(0.0, now - enqueued_at))

    def active(self, sequences: int, now: float | None = None) -> None:
        """Called whenever the number of requests in hand changes: busy time runs while it is above 0."""
        now = time.monotonic() if now is None else now
        if sequences > 0 and self._busy_since is None:
            self._busy_since = now
        elif sequences == 0 and self._busy_since is not None:
            self._add_busy(now - self._busy_since)
            self._busy_since = None

    def flush_busy(self, now: float | None = None) -> None:
        """Count the busy time so far (a scrape during a long busy spell sees it grow)."""
        now = time.monotonic() if now is None else now
        if self._busy_since is not None:
            self._add_busy(now - self._busy_since)
            self._busy_since = now

    def simulated(self, stats: dict[str, float]) -> None:
        """The simulated engine's own accounts (its CPU apart from the worker's, its lag behind schedule)."""
        for name, value in stats.items():
            gauge = self._sim.get(name)
            if gauge is None:
                gauge = self._sim[name] = Gauge(f"parley_worker_sim_{name}", f"simulated engine: {name}", ["pool"],
                                                registry=self.registry).labels(pool=self.pool)
            gauge.set(value)

    async def watch(self, engine: Any, active: Callable[[], int], every_s: float = 1.0) -> None:
        """Until cancelled: the engine's own figures (running, waiting, KV use; the simulator's accounts) and the
        busy time so far, each ``every_s``."""
        while True:
            stats = engine.stats()
            self.running.set(stats.get("running", active()))
            self.waiting.set(stats.get("waiting", 0))
            self.kv_usage.set(stats.get("kv_cache_usage", 0.0))
            sim_stats = getattr(engine, "sim_stats", None)
            if sim_stats is not None:
                self.simulated(sim_stats())
            self.flush_busy()
            await asyncio.sleep(every_s)

    def _add_busy(self, seconds: float) -> None:
        self.busy.inc(seconds)
        self.cost.inc(seconds * self._usd_per_s)

    def serve(self, port: int, host: str = "127.0.0.1") -> int:
        """Start the /metrics endpoint; port 0 picks a free one. Returns the port."""
        server, _thread = start_http_server(port, addr=host, registry=self.registry)
        return int(server.server_port)
