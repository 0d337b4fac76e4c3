"""The run's report: a plain dict (written as JSON, printed by ``table``), built from what was measured (pure)."""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from producers.loadgen import cpu, scrape
from producers.loadgen.hops import HOPS, hop_times
from producers.loadgen.plot import per_second
from producers.loadgen.record import RequestRecord
from producers.loadgen.stats import pct, per, summary

BACKBONE = ("kafka", "cassandra", "redis")
CLIENT = "loadgen"  # this process: the client's own cost, never counted as the service's


@dataclass
class Measured:
    records: list[RequestRecord]
    started: float
    idle: cpu.Window
    run: cpu.Window
    token_records: int  # records written to chat.tokens during the run
    statements: dict[str, int]  # Cassandra statements during the run, by view
    engine_before: dict[str, scrape.Samples] = field(default_factory=dict)  # pool -> samples
    engine_after: dict[str, scrape.Samples] = field(default_factory=dict)
    marks: dict[str, dict[str, float]] = field(default_factory=dict)  # generation -> event times
    samples: list[dict[str, Any]] = field(default_factory=list)
    planned_s: float = 0.0  # the schedule's length: the offered rate is arrivals over it
    record_gaps: list[float] = field(default_factory=list)  # between a generation's token records, as written


def build(m: Measured, meta: dict[str, Any]) -> dict[str, Any]:
    done = [r for r in m.records if r.ok]
    generated = engine_tokens(m)
    delivered = sum(r.tokens_out for r in done)
    tokens = generated or delivered
    return {**meta, "requests": requests(m.records), "client": {**client(done), "record_gap_ms": summary(
                m.record_gaps, 1000)}, "throughput": throughput(m, done),
            "tokens": {"generated": generated, "delivered": delivered, "delivered_events": sum(len(r.deltas)
                                                                                              for r in done)},
            "queue": queue(m.records), "hops_ms": hops(done, m.marks),
            "cpu": {**cpu_costs(m.run, m.idle, len(done), tokens), "engine": engine_cpu(m, len(done), tokens)},
            "kafka": {"token_records": m.token_records, "records_per_token": per(m.token_records, tokens)},
            "cassandra": {"statements": sum(m.statements.values()), "by_table": m.statements,
                          "per_request": per(sum(m.statements.values()), len(done))},
            "engine": engine(m), "lag": lag(m.samples)}


def requests(records: list[RequestRecord]) -> dict[str, Any]:
    return {"sent": len(records), "completed": sum(r.ok for r in records),
            "statuses": dict(Counter(str(r.status) for r in records)),
            "errors": dict(Counter(r.error for r in records if r.error)),
            "stop_reasons": dict(Counter(r.stop_reason for r in records if r.stop_reason)),
            "models": dict(Counter(r.model for r in records if r.model)),
            "retry_after_s": summary(r.retry_after_s for r in records)}


def client(done: list[RequestRecord]) -> dict[str, Any]:
    return {"ttft_ms": summary((r.ttft for r in done), 1000), "itl_ms": summary((g for r in done for g in r.gaps()),
                                                                                1000),
            # By plan: a plan whose output check holds each sentence back until checked (the free plan's, in
            # infra/config/safety.toml) shows its text a sentence at a time, so its gaps are a sentence long.
            "itl_ms_by_plan": {plan: summary((g for r in done if r.plan == plan for g in r.gaps()), 1000)
                               for plan in sorted({r.plan for r in done})},
            "tpot_ms": summary((r.tpot for r in done), 1000), "e2e_s": summary(r.done - r.sent for r in done),
            "prompt_tokens": summary(r.tokens_in for r in done), "reply_tokens": summary(r.tokens_out for r in done),
            "tokens_per_event": per(sum(r.tokens_out for r in done), sum(len(r.deltas) for r in done))}


def throughput(m: Measured, done: list[RequestRecord]) -> dict[str, Any]:
    span = (max(r.done for r in m.records) - m.started) if m.records else 0.0
    return {"arrivals_s": round(m.planned_s, 2), "wall_s": round(span, 2),
            "offered_per_s": per(len(m.records), m.planned_s),
            "completed_per_s": per(len(done), span), "tokens_delivered_per_s": per(sum(r.tokens_out for r in done),
                                                                                   span),
            "events_per_s": per(sum(len(r.deltas) for r in done), span),
            # the steady state: the busiest tenth of the seconds, with ramp-up and drain left out
            "tokens_per_s_p90_second": round(pct(list(per_second(m.records, m.started)["tokens"].values()), 90), 1)}


def queue(records: list[RequestRecord]) -> dict[str, Any]:
    queued = [r for r in records if r.queued_at is not None]
    both = [r for r in queued if r.real_wait_s is not None and r.shown_wait_s is not None]
    return {"queued": len(queued), "shown_wait_s": summary(r.shown_wait_s for r in queued),
            "real_wait_s": summary(r.real_wait_s for r in queued),
            "real_minus_shown_s": summary((r.real_wait_s or 0.0) - (r.shown_wait_s or 0.0) for r in both)}


def hops(done: list[RequestRecord], marks: dict[str, dict[str, float]]) -> dict[str, Any]:
    times = [h for h in (hop_times(r, marks.get(r.generation_id, {})) for r in done) if h is not None]
    return {"n": len(times), **{hop: {"p50": round(pct([t[hop] * 1000 for t in times], 50), 2),
                                      "p99": round(pct([t[hop] * 1000 for t in times], 99), 2)}
                                for hop in HOPS}} if times else {"n": 0}


def cpu_costs(run: cpu.Window, idle: cpu.Window, requests: int, tokens: int) -> dict[str, Any]:
    """Per process: CPU seconds, less idle, cores, ms per request and per token; and the service's totals."""
    added = cpu.less_idle(run, idle)
    rows = {name: {"cpu_s": round(run.used[name], 3), "less_idle_s": round(added[name], 3),
                   "cores": round(run.used[name] / run.seconds, 3) if run.seconds else None,
                   "idle_cores": round(idle.rates().get(name, 0.0), 3),
                   "ms_per_request": per(added[name], requests, 1000), "ms_per_token": per(added[name], tokens, 1000)}
            for name in run.used}
    service = sum(v for n, v in added.items() if n != CLIENT)
    pipeline = sum(v for n, v in added.items() if n != CLIENT and n not in BACKBONE)
    return {"window_s": round(run.seconds, 2), "idle_window_s": round(idle.seconds, 2), "processes": rows,
            "service": {"less_idle_s": round(service, 3), "ms_per_request": per(service, requests, 1000),
                        "ms_per_token": per(service, tokens, 1000)},
            "without_backbone": {"less_idle_s": round(pipeline, 3), "ms_per_request": per(pipeline, requests, 1000),
                                 "ms_per_token": per(pipeline, tokens, 1000)}}


def engine_cpu(m: Measured, requests: int, tokens: int) -> dict[str, Any]:
    """The simulated engine's own CPU (its thread time, counted inside its worker's process): the engine's
    stand-in, not the pipeline's. Zero on vLLM, whose engine core is a process of its own."""
    used = sum(scrape.total(m.engine_after.get(p, {}), "parley_worker_sim_cpu_seconds")
               - scrape.total(m.engine_before.get(p, {}), "parley_worker_sim_cpu_seconds") for p in m.engine_after)
    return {"cpu_s": round(used, 3), "ms_per_request": per(used, requests, 1000),
            "ms_per_token": per(used, tokens, 1000)}


def engine_tokens(m: Measured) -> int:
    return int(sum(scrape.total(m.engine_after.get(p, {}), "parley_worker_tokens_total")
                   - scrape.total(m.engine_before.get(p, {}), "parley_worker_tokens_total") for p in m.engine_after))


def engine(m: Measured) -> dict[str, Any]:
    """Per pool: what the worker's own /metrics say happened during the run, and the peaks sampled."""
    out = {}
    for pool, after in m.engine_after.items():
        before = m.engine_before.get(pool, {})

        def delta(name: str, after: scrape.Samples = after, before: scrape.Samples = before) -> float:
            return scrape.total(after, name) - scrape.total(before, name)

        rows = [s for s in m.samples if f"{pool}.running" in s]
        out[pool] = {"tokens": int(delta("parley_worker_tokens_total")),
                     "replies": int(delta("parley_worker_replies_total")),
                     "busy_s": round(delta("parley_worker_busy_seconds_total"), 2),
                     "prefix_hit_ratio": per(delta("parley_worker_cached_prompt_tokens_total"),
                                             delta("parley_worker_prompt_tokens_total")),
                     "ttft_ms_mean": per(delta("parley_worker_ttft_seconds_sum"),
                                         delta("parley_worker_ttft_seconds_count"), 1000),
                     "itl_ms_mean": per(delta("parley_worker_inter_token_seconds_sum"),
                                        delta("parley_worker_inter_token_seconds_count"), 1000),
                     "peak_running": max((s[f"{pool}.running"] for s in rows), default=None),
                     "peak_waiting": max((s[f"{pool}.waiting"] for s in rows), default=None),
                     "peak_kv": max((s[f"{pool}.kv"] for s in rows), default=None)}
    return out


def lag(samples: list[dict[str, Any]]) -> dict[str, Any]:
    """Each consumer group's highest and last lag (records) seen while the load ran."""
    groups = sorted({g for s in samples for g in s.get("lag", {})})
    last = samples[-1].get("lag", {}) if samples else {}
    return {g: {"max": max(s.get("lag", {}).get(g, 0) for s in samples), "last": last.get(g, 0)} for g in groups}


def headline(report: dict[str, Any]) -> dict[str, Any]:
    """One row of a scenario's table: the figures the issue asks for, from one step's report."""
    c, cost = report["client"], report["cpu"]["service"]
    procs = report["cpu"]["processes"]
    sim = report["cpu"].get("engine", {}).get("cpu_s", 0.0)
    return {"ttft_ms_p50": c["ttft_ms"].get("p50"), "ttft_ms_p99": c["ttft_ms"].get("p99"),
            "itl_ms_p50": c["itl_ms"].get("p50"), "itl_ms_p99": c["itl_ms"].get("p99"),
            "tokens_per_s": report["throughput"]["tokens_delivered_per_s"],
            "tokens_per_s_p90_second": report["throughput"]["tokens_per_s_p90_second"],
            "events_per_s": report["throughput"]["events_per_s"],
            "completed": report["requests"]["completed"], "sent": report["requests"]["sent"],
            "cpu_ms_per_request": cost["ms_per_request"], "cpu_ms_per_token": cost["ms_per_token"],
            "records_per_token": report["kafka"]["records_per_token"],
            "statements_per_request": report["cassandra"]["per_request"],
            "longest_wait_s": report["queue"]["real_wait_s"].get("max"),
            "longest_shown_wait_s": report["queue"]["shown_wait_s"].get("max"),
            "cores": {n: r["cores"] for n, r in procs.items()},
            "tokens_delivered": report["tokens"]["delivered"],
            "cpu_s": {"service": cost["less_idle_s"], "less backbone": report["cpu"]["without_backbone"]["less_idle_s"],
                      "service less engine": round(cost["less_idle_s"] - sim, 3), "engine (simulated)": sim,
                      **{n: r["less_idle_s"] for n, r in procs.items()}}}
