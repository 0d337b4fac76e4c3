"""Invariants of the batching lab (infra/lab): time, capacity, tokens, determinism, and the fleet limit."""

from __future__ import annotations

import argparse
import itertools
import json
from dataclasses import replace
from pathlib import Path

import pytest

from infra.planning.lab import cli
from infra.planning.lab.fleet import FleetConfig, arrivals, queue_series, simulate_fleet
from infra.planning.lab.metrics import percentile, summarize
from infra.planning.lab.sim import LabConfig, Mode, Run, simulate, workload

CONFIG = LabConfig()
RUNS = {mode: simulate(CONFIG, mode) for mode in Mode}


def _cap(run: Run) -> int:
    return run.config.static_max_seqs if run.mode is Mode.STATIC else run.config.max_seqs


@pytest.mark.parametrize("mode", list(Mode))
def test_nothing_is_served_before_it_arrives(mode: Mode) -> None:
    run = RUNS[mode]
    arrival = {p.request.id: p.request.arrival_s for p in run.requests}
    for p in run.requests:
        if p.admitted_s is not None:
            assert p.admitted_s >= p.request.arrival_s
        if p.first_token_s is not None:
            assert p.admitted_s is not None and p.first_token_s > p.admitted_s
    for step in run.steps:
        assert all(arrival[i] <= step.start_s for i in step.seqs)


@pytest.mark.parametrize("mode", list(Mode))
def test_steps_follow_each_other_inside_the_window(mode: Mode) -> None:
    steps = RUNS[mode].steps
    assert steps, "a minute of traffic must produce steps"
    for a, b in itertools.pairwise(steps):
        assert a.start_s < a.end_s <= b.start_s
    assert steps[-1].end_s <= CONFIG.duration_s


@pytest.mark.parametrize("mode", list(Mode))
def test_batch_never_exceeds_its_cap_and_reaches_it(mode: Mode) -> None:
    run = RUNS[mode]
    sizes = [len(s.seqs) for s in run.steps]
    assert max(sizes) == _cap(run)  # equal, not just below: the default load fills every mode's batch


def test_static_never_admits_into_a_running_batch() -> None:
    steps = RUNS[Mode.STATIC].steps
    for prev, step in itertools.pairwise(steps):
        newcomers = set(step.seqs) - set(prev.seqs)
        assert newcomers == set(step.admitted)
        if step.admitted:  # a new batch starts only on an empty replica
            assert set(step.seqs) == set(step.admitted)


@pytest.mark.parametrize("mode", [Mode.CONTINUOUS, Mode.CHUNKED])
def test_continuous_modes_do_admit_mid_batch(mode: Mode) -> None:
    # The static test above would fail on these runs: joining a running batch is their whole point.
    assert any(s.admitted and len(s.seqs) > len(s.admitted) for s in RUNS[mode].steps)


@pytest.mark.parametrize("mode", list(Mode))
def test_every_token_is_accounted_for(mode: Mode) -> None:
    run = RUNS[mode]
    assert sum(s.tokens for s in run.steps) == sum(p.generated for p in run.requests)
    assert sum(s.prefill_tokens for s in run.steps) == sum(p.prefilled for p in run.requests)
    for p in run.requests:
        assert p.prefilled <= p.request.prompt_tokens
        if p.first_token_s is not None:
            assert p.prefilled == p.request.prompt_tokens
        if p.finished_s is not None:
            assert p.generated == p.request.reply_tokens
        else:
            assert p.generated < p.request.reply_tokens
        assert p.generated <= sum(p.request.id in s.seqs for s in run.steps)


def test_chunked_prefill_stays_within_its_chunk_and_shortens_the_stall() -> None:
    chunked, whole = RUNS[Mode.CHUNKED], RUNS[Mode.CONTINUOUS]
    assert max(s.prefill_tokens for s in chunked.steps) <= CONFIG.chunk_tokens
    assert max(s.prefill_tokens for s in whole.steps) > CONFIG.chunk_tokens
    ceiling_ms = CONFIG.step_ms + CONFIG.step_ms_per_seq * CONFIG.max_seqs
    ceiling_ms += CONFIG.prefill_ms_per_token * CONFIG.chunk_tokens
    assert summarize(chunked).longest_step_ms <= ceiling_ms + 1e-9
    assert summarize(chunked).longest_step_ms < summarize(whole).longest_step_ms


def test_same_seed_same_run_other_seed_other_run() -> None:
    again = simulate(LabConfig(), Mode.CONTINUOUS)
    assert again == RUNS[Mode.CONTINUOUS]
    other = simulate(LabConfig(seed=CONFIG.seed + 1), Mode.CONTINUOUS)
    assert workload(other.config) != workload(CONFIG)
    assert summarize(other) != summarize(RUNS[Mode.CONTINUOUS])


def test_workload_spans_a_sentence_to_a_page() -> None:
    replies = [r.reply_tokens for r in workload(CONFIG)]
    low, _, high = CONFIG.reply_tokens
    assert low <= min(replies) < 60 and 300 < max(replies) <= high


@pytest.mark.parametrize("seed", [CONFIG.seed, 1, 2, 3])
def test_continuous_beats_static_on_throughput(seed: int) -> None:
    config = replace(CONFIG, seed=seed)
    static = summarize(simulate(config, Mode.STATIC))
    continuous = summarize(simulate(config, Mode.CONTINUOUS))
    assert continuous.tokens_per_s > 2 * static.tokens_per_s
    assert continuous.completed > static.completed
    assert continuous.ttft_p50_s < static.ttft_p50_s


def test_percentile_is_nearest_rank() -> None:
    values = [float(v) for v in range(1, 21)]
    assert (percentile(values, 50), percentile(values, 95), percentile(values, 100)) == (10, 19, 20)
    assert percentile([], 50) == 0


FLEET = simulate_fleet(FleetConfig())


def test_spike_overflows_to_the_small_model() -> None:
    assert FLEET.overflowed > 0
    c = FLEET.config
    spike = (c.spike_start_s, c.spike_start_s + c.spike_s)
    assert all(spike[0] <= r.arrival_s <= spike[1] + 1 for r in FLEET.requests if r.overflowed)


def test_no_request_queues_past_the_limit_without_overflowing() -> None:
    limit = FLEET.config.wait_limit_s
    assert limit is not None
    for r in FLEET.requests:
        if r.overflowed:
            assert r.estimated_wait_s > limit
        else:
            assert r.start_s is not None
            assert r.start_s - r.arrival_s == pytest.approx(r.estimated_wait_s)
            assert r.start_s - r.arrival_s <= limit


def test_fleet_serves_first_in_first_out() -> None:
    starts = [r.start_s for r in FLEET.requests if r.start_s is not None]
    assert starts == sorted(starts)


def test_even_arrivals_reproduce_the_seed_arithmetic() -> None:
    # (70 - 50) x 60 = 1,200 waiting, the last one about 24 s: exact once arrivals are evenly spaced.
    even = simulate_fleet(FleetConfig(wait_limit_s=None, poisson=False))
    assert even.overflowed == 0
    assert max(queue_series(even)[1]) == pytest.approx(1200, abs=15)
    assert even.max_wait_s == pytest.approx(24, abs=0.5)
    assert len(arrivals(FleetConfig(poisson=False))) == pytest.approx(35 * 120 + 70 * 60, abs=3)


def test_limit_caps_the_queue_at_limit_times_rate() -> None:
    assert max(queue_series(FLEET)[1]) <= FLEET.config.capacity_rps * 10 + FLEET.config.replicas
    assert min(queue_series(FLEET)[1]) >= 0


def _args(tmp_path: Path, *extra: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser, "lab")
    return parser.parse_args(["--out", str(tmp_path), *extra])


def test_cli_json_reports_each_mode_and_the_fleet(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.run(_args(tmp_path, "--json", "--no-plots")) == 0
    out = json.loads(capsys.readouterr().out)
    assert [r["mode"] for r in out["replica"]] == ["static", "continuous", "chunked"]
    assert out["fleet"]["overflowed_small"] == FLEET.overflowed
    assert not list(tmp_path.iterdir())


def test_cli_writes_one_png_per_mode_and_the_fleet(tmp_path: Path) -> None:
    assert cli.run(_args(tmp_path, "--rate", "1", "--duration", "20")) == 0
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == ["fleet-spike.png", "replica-chunked.png", "replica-continuous.png", "replica-static.png"]
    assert all((tmp_path / n).read_bytes()[:4] == b"\x89PNG" for n in names)
