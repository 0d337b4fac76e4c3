"""The benchmarks' CPU split: per-process deltas per 1,000 tokens, engine vs the rest, real /proc counts."""
from __future__ import annotations

import os
import time

from tests.benchmarks import cpu_split


def test_split_charges_engine_and_pipeline_per_thousand_tokens() -> None:
    before = {"gateway-a": 1.0, "stages": 2.0, "kafka": 10.0, "engine core (worker-large)": 5.0}
    after = {"gateway-a": 1.5, "stages": 3.0, "kafka": 10.5, "engine core (worker-large)": 9.0}
    s = cpu_split.split(before, after, tokens=2000, seconds=2.0)
    assert s["processes"]["gateway-a"] == {"cpu_s": 0.5, "cores": 0.25, "ms_per_1k_tokens": 250.0}
    assert s["engine_ms_per_1k"] == 2000.0  # 4 s over 2 k tokens
    assert s["pipeline_ms_per_1k"] == 1000.0  # gateway + stages + kafka: 2 s
    assert s["pipeline_without_backbone_ms_per_1k"] == 750.0


def test_a_process_gone_before_the_end_is_left_out_and_no_tokens_is_not_a_crash() -> None:
    s = cpu_split.split({"gateway-a": 1.0, "stages": 1.0}, {"stages": 1.2}, tokens=0, seconds=1.0)
    assert list(s["processes"]) == ["stages"]
    assert s["pipeline_ms_per_1k"] != s["pipeline_ms_per_1k"]  # NaN: nothing delivered, nothing to divide


def test_snapshot_reads_this_process_cpu_and_skips_dead_pids() -> None:
    start = cpu_split.snapshot({"me": os.getpid(), "gone": 2**22 + 12345})
    t = time.process_time()
    while time.process_time() - t < 0.2:
        sum(range(1000))
    end = cpu_split.snapshot({"me": os.getpid()})
    assert "gone" not in start
    assert end["me"] - start["me"] >= 0.15
