"""`parley loadtest --scenario replica` at a tiny rate for a few seconds: a private service on sim engines is
started on the real backbone, loaded over HTTP/SSE and stopped, and its summary has the figures the issue asks
for. A smoke run, not a timing: the figures only have to exist and make sense."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from infra.config.settings import Settings

pytestmark = pytest.mark.integration


def test_replica_scenario_reports_client_and_service_figures(stack_settings: Settings, tmp_path: Path) -> None:
    summary = tmp_path / "summary.json"
    env = {**os.environ, **stack_settings.to_env()}
    done = subprocess.run([sys.executable, "-m", "infra.local.cli", "loadtest", "--scenario", "replica",
                           "--duration", "4", "--rate-scale", "0.5", "--keyspace", stack_settings.keyspace,
                           "--summary", str(summary)], env=env, capture_output=True, text=True, timeout=420)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]

    [step] = json.loads(summary.read_text())["steps"]
    assert step["sent"] >= 1 and step["completed"] == step["sent"]
    assert step["ttft_ms_p50"] > 0 and step["itl_ms_p50"] > 0 and step["itl_ms_p99"] >= step["itl_ms_p50"]
    assert 0 < step["records_per_token"] <= 1  # one record holds one or more tokens, never fewer
    assert step["statements_per_request"] > 0
    assert step["cpu_ms_per_request"] > 0 and {"gateway-0", "stages", "worker-large-0"} <= set(step["cores"])
    assert all(Path(f).exists() for f in step["files"])
