"""``python -m infra.deploy.dashboard``: the Grafana dashboard (grafana/parley.json) of the seed's watch list,
generated from the same PromQL as the recording rules (infra/local/prometheus.py), so the dashboard, the
rules, `parley report` and the metrics test never disagree. Import it into Grafana with a Prometheus data
source named by the ``DS_PROMETHEUS`` input.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

from infra.local.prometheus import RULES

DASHBOARD_FILE = Path(__file__).with_name("grafana") / "parley.json"
_BY_OUTCOME = ('sum by (plan, outcome) (rate(parley_scheduler_decisions_total{outcome!="routed"}[5m]))'
               " / ignoring(outcome) group_left sum by (plan) (rate(parley_scheduler_decisions_total[5m]))")
DS = {"type": "prometheus", "uid": "${DS_PROMETHEUS}"}
# (title, unit, [(legend, expr)])
PANELS: list[tuple[str, str, list[tuple[str, str]]]] = [
    ("TTFT p50 / p95 by plan (gateway, end to end)", "s",
     [("p50 {{plan}}", RULES["parley:ttft_seconds:p50"]), ("p95 {{plan}}", RULES["parley:ttft_seconds:p95"])]),
    ("Tokens per second by plan", "short", [("{{plan}}", RULES["parley:tokens_per_second:rate"])]),
    ("Queue time p50 / p95 by lane", "s", [("p50 {{pool}}.{{lane}}", RULES["parley:queue_seconds:p50"]),
                                           ("p95 {{pool}}.{{lane}}", RULES["parley:queue_seconds:p95"])]),
    ("KV-cache use by pool", "percentunit", [("{{pool}}", RULES["parley:kv_cache_usage:ratio"])]),
    ("Prefix-cache hit rate by pool", "percentunit", [("{{pool}}", RULES["parley:prefix_cache_hit:ratio"])]),
    ("Fallback rate (overflow, canned, refused) by plan", "percentunit",
     [("{{plan}}", RULES["parley:fallback:ratio"]),
      ("{{outcome}} {{plan}}", _BY_OUTCOME)]),
    ("Cost per 1,000 replies (busy GPU time at the configured $/GPU-hour)", "currencyUSD",
     [("all pools", RULES["parley:cost_per_1000_replies:usd"])]),
    ("Kafka consumer lag by group", "short", [("{{group}}", RULES["parley:consumer_lag:records"])]),
    ("Reservations outstanding", "short", [("reservations", "max(parley_reservations_outstanding)")]),
    ("Stream reconnects per second by plan", "short",
     [("{{plan}}", "sum by (plan) (rate(parley_gateway_stream_reconnects_total[5m]))")]),
    ("Refusals per second by HTTP status", "short",
     [("{{status}}", "sum by (status) (rate(parley_gateway_refusals_total[5m]))")]),
    ("Safety block rate by check and plan", "percentunit",
     [("{{check}} {{plan}}", RULES["parley:safety_block:ratio"])]),
]


def dashboard() -> dict[str, object]:
    panels = []
    for i, (title, unit, queries) in enumerate(PANELS):
        panels.append({
            "id": i + 1, "type": "timeseries", "title": title, "datasource": DS,
            "gridPos": {"h": 8, "w": 12, "x": (i % 2) * 12, "y": (i // 2) * 8},
            "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
            "targets": [{"refId": chr(65 + j), "datasource": DS, "expr": expr, "legendFormat": legend}
                        for j, (legend, expr) in enumerate(queries)],
        })
    return {
        "__inputs": [{"name": "DS_PROMETHEUS", "label": "Prometheus", "type": "datasource", "pluginId": "prometheus"}],
        "title": "Parley: the watch list", "uid": "parley-watch-list", "schemaVersion": 39, "version": 1,
        "time": {"from": "now-1h", "to": "now"}, "refresh": "10s", "tags": ["parley"], "panels": panels,
    }


def main() -> int:
    DASHBOARD_FILE.parent.mkdir(parents=True, exist_ok=True)
    DASHBOARD_FILE.write_text(json.dumps(dashboard(), indent=1) + "\n")
    print(f"{len(PANELS)} panels written to {DASHBOARD_FILE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
