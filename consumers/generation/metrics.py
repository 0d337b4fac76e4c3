"""Prometheus metrics of one generation worker (one registry per worker, served on its own port)."""
from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

_LAT = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)


class WorkerMetrics:
    def __init__(self, pool: str) -> None:
        self.registry = r = CollectorRegistry()
        labels = {"pool": pool}
        self.ttft = Histogram("parley_worker_ttft_seconds", "request picked up to first token", ["pool"],
                              buckets=_LAT, registry=r).labels(**labels)
        self.itl = Histogram("parley_worker_inter_token_seconds", "time between token appends per sequence",
                             ["pool"], buckets=_LAT, registry=r).labels(**labels)
        self.tokens = Counter("parley_worker_tokens", "completion tokens generated", ["pool"],
                              registry=r).labels(**labels)
        self.running = Gauge("parley_worker_running_sequences", "sequences in the engine", ["pool"],
                             registry=r).labels(**labels)
        self.waiting = Gauge("parley_worker_waiting_sequences", "sequences waiting in the engine", ["pool"],
                             registry=r).labels(**labels)
        self.kv_usage = Gauge("parley_worker_kv_cache_usage", "fraction of KV cache blocks in use", ["pool"],
                              registry=r).labels(**labels)
        self.prefix_hit_rate = Gauge("parley_worker_prefix_cache_hit_rate", "cached / total prompt tokens",
                                     ["pool"], registry=r).labels(**labels)
        self.aborts = Counter("parley_worker_aborts", "generations stopped by a cancel", ["pool"],
                              registry=r).labels(**labels)
        self.recoveries = Counter("parley_worker_recoveries", "generations continued from saved tokens",
                                  ["pool"], registry=r).labels(**labels)
        self.failures = Counter("parley_worker_failures", "generations that ended failed", ["pool"],
                                registry=r).labels(**labels)
        self.prompt_tokens = 0
        self.cached_prompt_tokens = 0

    def prompt_seen(self, prompt_tokens: int, cached: int) -> None:
        self.prompt_tokens += prompt_tokens
        self.cached_prompt_tokens += cached
        if self.prompt_tokens:
            self.prefix_hit_rate.set(self.cached_prompt_tokens / self.prompt_tokens)

    def serve(self, port: int) -> int:
        """Start the /metrics endpoint; port 0 picks a free one. Returns the port."""
        server, _thread = start_http_server(port, addr="127.0.0.1", registry=self.registry)
        return int(server.server_port)
