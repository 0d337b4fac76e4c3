"""A real Prometheus (Debian's ``prometheus`` package) for `parley up --with-prometheus`: the scrape
config is generated from the same settings and pools that place every process's /metrics, written to
``<state>/prometheus/prometheus.yml`` with the recording rules of the watch list beside it.

    gateway   http://127.0.0.1:8000/metrics         (Settings.ports.gateway; 8001.. with `--gateways N`)
    stages    http://127.0.0.1:9101/metrics         (Settings.ports.stages_metrics)
    workers   http://127.0.0.1:9111, 9112 /metrics  (metrics_port of each pool in pools.toml)
"""
from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Mapping
from pathlib import Path

from infra.config.settings import Settings
from infra.local.errors import StackError

SCRAPE_INTERVAL_S = 5  # a chat reply lasts seconds: a coarser scrape would miss a whole test run

# The seed's watch list as recording rules, so the dashboard, `parley report` and the test ask the same thing.
_TTFT = "sum by (le, plan) (rate(parley_gateway_ttft_seconds_bucket[1m]))"
_QUEUE = "sum by (le, pool, lane) (rate(parley_worker_queue_seconds_bucket[1m]))"
RULES: dict[str, str] = {
    "parley:ttft_seconds:p50": f"histogram_quantile(0.5, {_TTFT})",
    "parley:ttft_seconds:p95": f"histogram_quantile(0.95, {_TTFT})",
    "parley:tokens_per_second:rate": "sum by (plan) (rate(parley_gateway_completion_tokens_total[1m]))",
    "parley:queue_seconds:p50": f"histogram_quantile(0.5, {_QUEUE})",
    "parley:queue_seconds:p95": f"histogram_quantile(0.95, {_QUEUE})",
    "parley:kv_cache_usage:ratio": "max by (pool) (parley_worker_kv_cache_usage_ratio)",
    "parley:prefix_cache_hit:ratio": "sum by (pool) (rate(parley_worker_cached_prompt_tokens_total[5m])) "
                                     "/ sum by (pool) (rate(parley_worker_prompt_tokens_total[5m]))",
    "parley:fallback:ratio": "sum by (plan) (rate(parley_scheduler_decisions_total{outcome!=\"routed\"}[5m])) "
                             "/ sum by (plan) (rate(parley_scheduler_decisions_total[5m]))",
    "parley:cost_per_1000_replies:usd": "1000 * sum(rate(parley_worker_cost_usd_total[5m])) "
                                        "/ sum(rate(parley_worker_replies_total[5m]))",
    "parley:consumer_lag:records": "sum by (group) (parley_kafka_consumer_lag_records)",
    # the safety checks' own counters (consumers/safety/metrics.py): input in the stages, output in the workers
    "parley:safety_block:ratio": "sum by (check, plan) (rate(parley_safety_blocks_total[5m])) "
                                 "/ sum by (check, plan) (rate(parley_safety_checks_total[5m]))",
}


def targets(settings: Settings, worker_ports: Mapping[str, int]) -> dict[str, list[str]]:
    """Prometheus job -> host:port of each process's /metrics."""
    host = settings.host
    from infra.local.balancer import gateway_ports

    found = {"gateway": [f"{host}:{port}" for port in gateway_ports(settings)],
             "stages": [f"{host}:{settings.ports.stages_metrics}"]}
    workers = [f"{host}:{port}" for _, port in sorted(worker_ports.items()) if port]
    if workers:
        found["workers"] = workers
    return found


def scrape_config(settings: Settings, worker_ports: Mapping[str, int], rules_file: str = "rules.yml") -> str:
    """prometheus.yml (YAML is a superset of JSON: written as JSON, so no YAML library is needed)."""
    import json

    jobs = [{"job_name": job, "scrape_interval": f"{SCRAPE_INTERVAL_S}s", "static_configs": [{"targets": hosts}]}
            for job, hosts in targets(settings, worker_ports).items()]
    return json.dumps({"global": {"scrape_interval": f"{SCRAPE_INTERVAL_S}s",
                                  "evaluation_interval": f"{SCRAPE_INTERVAL_S}s"},
                       "rule_files": [rules_file], "scrape_configs": jobs}, indent=1) + "\n"


def rules_config() -> str:
    import json

    return json.dumps({"groups": [{"name": "parley-watch-list", "rules": [
        {"record": name, "expr": expr} for name, expr in RULES.items()]}]}, indent=1) + "\n"


def home(settings: Settings) -> Path:
    return settings.state_dir / "prometheus"


def write_config(settings: Settings, worker_ports: Mapping[str, int]) -> Path:
    folder = home(settings)
    (folder / "data").mkdir(parents=True, exist_ok=True)
    (folder / "rules.yml").write_text(rules_config())
    path = folder / "prometheus.yml"
    path.write_text(scrape_config(settings, worker_ports))
    return path


def find_binary() -> str | None:
    return shutil.which("prometheus") or ("/usr/bin/prometheus" if os.path.exists("/usr/bin/prometheus") else None)


def install() -> str:
    """Debian's package, with apt-get, when running as root; its own service is not what we run."""
    found = find_binary()
    if found:
        return found
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        raise StackError("prometheus is not installed", hint="apt-get install -y --no-install-recommends prometheus")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    subprocess.run(["apt-get", "update", "-qq"], env=env, capture_output=True, timeout=600, check=False)
    done = subprocess.run(["apt-get", "install", "-y", "-qq", "--no-install-recommends", "prometheus"], env=env,
                          capture_output=True, text=True, timeout=900, check=False)
    found = find_binary()
    if found is None:
        raise StackError(f"apt-get install prometheus failed (exit {done.returncode})",
                         hint="apt-get install -y --no-install-recommends prometheus",
                         log_tail="\n".join((done.stdout + done.stderr).splitlines()[-10:]))
    return found


def command(binary: str, settings: Settings, config: Path) -> tuple[str, ...]:
    return (binary, f"--config.file={config}", f"--storage.tsdb.path={home(settings) / 'data'}",
            f"--web.listen-address={settings.host}:{settings.ports.prometheus}", "--storage.tsdb.retention.time=7d")
