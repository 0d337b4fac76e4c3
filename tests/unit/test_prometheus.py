"""The generated Prometheus set-up: a target for every process on its configured port, recording rules and
dashboard queries that Prometheus' own checker accepts, and a dashboard file that is not stale."""
from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

from infra.config.settings import Ports, Settings
from infra.deploy.dashboard import DASHBOARD_FILE, PANELS, dashboard
from infra.local import prometheus
from tests.tools import needs

PROMTOOL = shutil.which("promtool")
needs_promtool = needs(PROMTOOL, "promtool", "apt-get install prometheus (Debian's package brings it)")


def test_every_process_is_a_target_on_its_configured_port() -> None:
    settings = Settings(ports=Ports(gateway=18000, stages_metrics=19101))
    config = json.loads(prometheus.scrape_config(settings, {"large": 19111, "small": 19112, "tiny": 0}))
    targets = {job["job_name"]: job["static_configs"][0]["targets"] for job in config["scrape_configs"]}
    assert targets == {"gateway": ["127.0.0.1:18000"], "stages": ["127.0.0.1:19101"],
                       "workers": ["127.0.0.1:19111", "127.0.0.1:19112"]}  # a pool on port 0 is not scrapable
    assert config["rule_files"] == ["rules.yml"]


@needs_promtool
def test_promtool_accepts_the_generated_config_and_rules(tmp_path: Path) -> None:
    path = prometheus.write_config(Settings(state_dir=tmp_path), {"large": 9111})
    done = subprocess.run([PROMTOOL, "check", "config", str(path)], capture_output=True, text=True)  # type: ignore[list-item]
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"{len(prometheus.RULES)} rules found" in done.stdout + done.stderr


@needs_promtool
def test_every_dashboard_query_is_valid_promql(tmp_path: Path) -> None:
    exprs = [expr for _, _, queries in PANELS for _, expr in queries]
    rules = {"groups": [{"name": "dashboard", "rules": [{"record": f"check:{i}", "expr": e}
                                                         for i, e in enumerate(exprs)]}]}
    path = tmp_path / "dashboard-rules.yml"
    path.write_text(json.dumps(rules))
    done = subprocess.run([PROMTOOL, "check", "rules", str(path)], capture_output=True, text=True)  # type: ignore[list-item]
    assert done.returncode == 0, done.stdout + done.stderr


def test_dashboard_file_is_generated_from_the_rules() -> None:
    assert json.loads(DASHBOARD_FILE.read_text()) == dashboard(), "stale: run `python -m infra.deploy.dashboard`"
    titles = [p["title"] for p in dashboard()["panels"]]  # type: ignore[index]
    for item in ("TTFT", "Tokens per second", "Queue time", "KV-cache", "Prefix-cache", "Fallback", "Cost",
                 "consumer lag", "Reservations", "reconnects", "Safety"):
        assert any(item in t for t in titles), item
