"""The load test's report: CPU idle correction, per-hop times, the report's figures, scenario verdicts and the
private service's configuration files."""
from __future__ import annotations

import tomllib

import pytest

from infra.local import loadtest_scenarios as scenarios
from infra.local.loadtest_service import ServiceSpec, SimPool, plans_toml, pools_toml
from producers.loadgen import cpu, report, scrape
from producers.loadgen.hops import HOPS, hop_times
from producers.loadgen.plot import per_second
from producers.loadgen.record import RequestRecord


def _done(i: int, sent: float, gid: str = "") -> RequestRecord:
    return RequestRecord(i, "paid", 0, sent=sent, status=200, generation_id=gid, deltas=[sent + 0.5, sent + 0.6,
                                                                                          sent + 0.8],
                         done=sent + 0.9, stop_reason="end", tokens_in=100, tokens_out=6)


def test_cpu_less_idle_takes_each_process_idle_rate_off() -> None:
    idle = cpu.Window(10.0, {"kafka": 1.0, "gateway": 0.0})
    run = cpu.Window(20.0, {"kafka": 5.0, "gateway": 4.0, "redis": 1.0})

    assert cpu.less_idle(run, idle) == {"kafka": 3.0, "gateway": 4.0, "redis": 1.0}
    assert cpu.less_idle(cpu.Window(20.0, {"kafka": 1.0}), idle) == {"kafka": 0.0}  # never negative


def test_own_cpu_seconds_are_read_from_proc() -> None:
    import os

    assert cpu.own_seconds(os.getpid()) > 0
    assert os.getpid() in cpu.tree(os.getpid())


def test_hops_add_up_to_the_time_to_first_token() -> None:
    r = _done(0, 100.0, "g")
    marks = {"MessageSubmitted": 100.01, "RequestAdmitted": 100.03, "PromptBuilt": 100.06,
             "GenerationRequested": 100.07, "started_at": 100.1, "first_token_at": 100.4}
    hops = hop_times(r, marks)

    assert hops is not None and list(hops) == list(HOPS)
    assert sum(hops.values()) == pytest.approx(r.ttft)
    assert hops["engine_first_token"] == pytest.approx(0.3) and hops["delivery"] == pytest.approx(0.1)
    assert hop_times(r, {k: v for k, v in marks.items() if k != "PromptBuilt"}) is None


def _measured() -> report.Measured:
    records = [_done(i, 1000.0 + i, f"g{i}") for i in range(4)]
    records.append(RequestRecord(4, "free", 0, sent=1004.0, status=429, error="rate_limited", retry_after_s=3.0,
                                 done=1004.01))
    engine = "parley_worker_tokens_total"
    return report.Measured(records, 1000.0, cpu.Window(10.0, {"gateway": 0.1, "kafka": 1.0, "loadgen": 0.0}),
                           cpu.Window(5.0, {"gateway": 0.45, "kafka": 1.5, "loadgen": 2.0}), token_records=12,
                           statements={"write messages": 8, "read users": 4}, engine_before={"large": {engine: 10.0}},
                           engine_after={"large": {engine: 34.0, "parley_worker_sim_cpu_seconds": 0.3}},
                           planned_s=5.0)


def test_report_has_the_figures_the_issue_asks_for() -> None:
    r = report.build(_measured(), {"scenario": "t"})

    assert r["requests"]["completed"] == 4 and r["requests"]["errors"] == {"rate_limited": 1}
    assert r["client"]["ttft_ms"]["p50"] == 500.0 and r["client"]["itl_ms"]["n"] == 8
    assert r["tokens"] == {"generated": 24, "delivered": 24, "delivered_events": 12}
    assert r["kafka"]["records_per_token"] == 0.5
    assert r["cassandra"]["per_request"] == 3.0
    assert r["throughput"]["offered_per_s"] == 1.0
    gateway = r["cpu"]["processes"]["gateway"]
    assert gateway["less_idle_s"] == 0.4 and gateway["ms_per_request"] == 100.0
    assert r["cpu"]["service"]["less_idle_s"] == pytest.approx(1.4)  # the client's own CPU left out
    assert r["cpu"]["without_backbone"]["less_idle_s"] == pytest.approx(0.4)
    assert r["cpu"]["engine"]["cpu_s"] == pytest.approx(0.3)  # the simulator's own, inside its worker
    row = report.headline(r)
    assert row["records_per_token"] == 0.5 and row["statements_per_request"] == 3.0
    assert row["cpu_s"]["service less engine"] == pytest.approx(1.1)


def test_per_second_series() -> None:
    series = per_second([_done(0, 10.0), _done(1, 10.5)], started=10.0)
    assert series["sent"] == {0: 2} and series["completed"] == {0: 1, 1: 1}
    assert sum(series["tokens"].values()) == pytest.approx(12)


def test_scrape_parses_prometheus_text_and_sums_over_labels() -> None:
    text = ('# TYPE parley_worker_tokens counter\nparley_worker_tokens_total{pool="large"} 42.0\n'
            '# TYPE parley_kafka_consumer_lag_records gauge\n'
            'parley_kafka_consumer_lag_records{group="p.admission",topic="p.chat.requests"} 3.0\n'
            'parley_kafka_consumer_lag_records{group="p.prompt",topic="p.chat.admitted"} 2.0\n')
    got = scrape.parse(text, scrape.ENGINE + scrape.STAGES)

    assert got["parley_worker_tokens_total"] == 42.0  # the pool label is folded away
    assert scrape.total(got, "parley_kafka_consumer_lag_records") == 5.0


def _step_report(sent: int, completed: int, ttft_p50: float, lag_last: float) -> dict:
    return {"requests": {"sent": sent, "completed": completed}, "client": {"ttft_ms": {"p50": ttft_p50}},
            "throughput": {"offered_per_s": 4.0}, "lag": {"persistence": {"max": lag_last, "last": lag_last},
                                                          "abandoned": {"max": 500, "last": 500}},
            "cpu": {"processes": {"gateway": {"cores": 0.3}, "stages": {"cores": 0.97}, "loadgen": {"cores": 1.2}}}}


def test_a_step_is_sustained_only_when_the_pipeline_keeps_up() -> None:
    assert scenarios.sustained(_step_report(100, 100, 300.0, 0))
    assert not scenarios.sustained(_step_report(100, 90, 300.0, 0))
    assert not scenarios.sustained(_step_report(100, 100, 9000.0, 0))
    assert not scenarios.sustained(_step_report(100, 100, 300.0, 400))
    assert scenarios.busiest(_step_report(1, 1, 1, 0)) == "stages"  # the client itself never counts


def test_spike_prediction_is_the_seeds_arithmetic() -> None:
    # (70 - 50) x 60 = 1,200 waiting; the last waits ~24 s
    assert scenarios.spike_prediction(70, 50, 60) == {"served_per_s": 50, "waiting": 1200.0, "last_wait_s": 24.0}


def test_every_scenario_is_bounded() -> None:
    for name, make in scenarios.SCENARIOS.items():
        steps = make(scenarios.Knobs(duration_s=5, rate_scale=0.5))
        assert steps, name
        for step in steps:
            assert all(p.seconds <= 5 for p in step.load.phases) and step.load.limit and step.load.drain_s <= 120


def test_private_service_files_run_every_pool_on_the_sim_engine() -> None:
    spec = ServiceSpec({"large": SimPool(max_num_seqs=183, sim={"prefill": "disaggregated", "prefill_chunk": 0}),
                        "small": SimPool(max_num_seqs=8)})
    pools = tomllib.loads(pools_toml(spec))
    assert pools["defaults"]["engine"] == "sim"
    assert pools["pools"]["large"]["sim"] == {"prefill": "disaggregated", "prefill_chunk": 0}
    plans = tomllib.loads(plans_toml())["plans"]
    assert plans["free"]["reply_cap"] == 2000 and plans["free"]["queue_wait_limit_s"] == 10  # waits as shipped


def test_private_pools_file_is_one_the_service_accepts(tmp_path) -> None:
    from infra.config.pools import load_pools
    from infra.config.settings import Settings

    path = tmp_path / "pools.toml"
    path.write_text(pools_toml(ServiceSpec({"large": SimPool(sim={"prefill_chunk": 256}), "small": SimPool()})))
    pools = load_pools(Settings().with_(pools_file=path, cache_dir=tmp_path), on_gpu=False)

    assert pools["large"].engine == "sim" and pools["large"].sim.prefill_chunk == 256
    assert pools["large"].max_model_len >= 6000 + 2000  # the seeds' prompt budget and reply cap fit


def test_record_gaps_are_per_generation_and_in_the_report() -> None:
    from producers.loadgen.hops import TOKEN_RECORD, record_gaps
    from schemas import TokensAppended, keyless

    assert keyless(TokensAppended(generation_id="g", conversation_id="c", seq=0, text="x")).startswith(TOKEN_RECORD)
    # Two generations interleaved: a gap is only ever between records of one generation, in time order.
    gaps = record_gaps({b"g1": [10.0, 10.1, 10.6], b"g2": [10.05, 10.08]})
    assert sorted(round(g, 3) for g in gaps) == [0.03, 0.1, 0.5]
    m = _measured()
    m.record_gaps = gaps
    assert report.build(m, {})["client"]["record_gap_ms"]["max"] == 500.0


def test_inter_token_gaps_are_also_given_per_plan() -> None:
    m = _measured()
    for r in m.records[1:4]:
        r.plan = "free"
    by_plan = report.build(m, {})["client"]["itl_ms_by_plan"]
    assert set(by_plan) == {"paid", "free"} and by_plan["paid"]["n"] == 2 and by_plan["free"]["n"] == 6


def test_two_reply_lengths_split_the_cost_into_a_token_and_a_request() -> None:
    # 100 requests; each costs 20 ms and each token 0.05 ms: 32,000 and 128,000 tokens cost 3.6 s and 8.4 s
    short = {"completed": 100, "tokens_delivered": 32_000, "cpu_s": {"service": 3.6, "gateway-0": 1.0}}
    long = {"completed": 100, "tokens_delivered": 128_000, "cpu_s": {"service": 8.4, "gateway-0": 1.0}}
    split = scenarios.split_cost(short, long)
    assert split["tokens_added"] == 96_000
    assert split["service"] == {"ms_per_token": 0.05, "ms_per_request": 20.0}
    assert split["gateway-0"] == {"ms_per_token": 0.0, "ms_per_request": 10.0}  # it did no more for longer replies
    assert scenarios.SCENARIOS["marginal"](scenarios.Knobs())[0].load.phases[0].rate == 2.0


def test_repeated_pairs_give_the_mean_split_and_its_range() -> None:
    steps = scenarios.SCENARIOS["marginal"](scenarios.Knobs(repeat=2))
    assert [s.label for s in steps] == ["replies ~320 tokens (1)", "replies ~1280 tokens (1)",
                                        "replies ~320 tokens (2)", "replies ~1280 tokens (2)"]
    short = {"completed": 100, "tokens_delivered": 32_000, "cpu_s": {"service": 3.6}}
    rows = [short, {"completed": 100, "tokens_delivered": 128_000, "cpu_s": {"service": 8.4}},  # 0.05 a token
            short, {"completed": 100, "tokens_delivered": 128_000, "cpu_s": {"service": 12.24}}]  # 0.09
    split = scenarios.split_costs(rows)
    assert split["pairs"] == 2 and split["tokens_added"] == 192_000
    assert split["service"]["ms_per_token"] == pytest.approx(0.07)
    assert (split["service"]["min"], split["service"]["max"]) == (0.05, 0.09)
