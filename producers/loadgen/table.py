"""The report, printed: the client's figures, then the costs per process (rich)."""
from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table

from producers.loadgen.hops import BUDGET_MS


def _f(value: Any, digits: int = 1) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:,.{digits}f}"
    return f"{value:,}" if isinstance(value, int) else str(value)


def _p(section: dict[str, Any], q: str = "p50") -> str:
    return _f(section.get(q))


def console() -> Console:
    """A terminal's own width; 160 columns in a log file, so the tables stay readable."""
    import sys

    return Console() if sys.stdout.isatty() else Console(width=160)


def show(report: dict[str, Any], out: Console | None = None) -> None:
    term = out or console()
    term.print(summary_table(report))
    term.print(cpu_table(report))
    if report["hops_ms"].get("n"):
        term.print(hops_table(report))
    for pool, e in report["engine"].items():
        term.print(f"engine {pool}: {e['tokens']:,} tokens, {e['replies']} replies, busy {e['busy_s']} s, "
                   f"peak running {_f(e['peak_running'], 0)} waiting {_f(e['peak_waiting'], 0)} "
                   f"kv {_f(e['peak_kv'], 2)}, prefix hits {_f(e['prefix_hit_ratio'], 2)}, "
                   f"mean TTFT {_f(e['ttft_ms_mean'])} ms, mean ITL {_f(e['itl_ms_mean'])} ms")
    if report["lag"]:
        term.print("consumer lag (max/last records): " + ", ".join(
            f"{g} {int(v['max'])}/{int(v['last'])}" for g, v in report["lag"].items()))


def summary_table(r: dict[str, Any]) -> Table:
    c, t, q, req = r["client"], r["throughput"], r["queue"], r["requests"]
    table = Table(title=f"loadtest {r.get('scenario', '')} {r.get('step', '')}: {req['completed']}/{req['sent']} "
                        "completed")
    for col in ("figure", "p50", "p99", "other"):
        table.add_column(col, justify="right" if col != "figure" else "left")
    table.add_row("TTFT ms", _p(c["ttft_ms"]), _p(c["ttft_ms"], "p99"), f"max {_p(c['ttft_ms'], 'max')}")
    table.add_row("ITL ms (per event)", _p(c["itl_ms"]), _p(c["itl_ms"], "p99"),
                  f"{_f(c['tokens_per_event'], 2)} tokens/event")
    for plan, itl in c.get("itl_ms_by_plan", {}).items():
        table.add_row(f"  ITL ms, {plan} plan", _p(itl), _p(itl, "p99"), f"{itl.get('n', 0):,} gaps")
    if c.get("record_gap_ms", {}).get("n"):
        table.add_row("gap between token records as written, ms", _p(c["record_gap_ms"]),
                      _p(c["record_gap_ms"], "p99"), "the worker's side of the ITL")
    table.add_row("TPOT ms", _p(c["tpot_ms"]), _p(c["tpot_ms"], "p99"), "")
    table.add_row("prompt / reply tokens", _p(c["prompt_tokens"]), _p(c["reply_tokens"]), "(p50 each)")
    table.add_row("queued: shown / real wait s", _p(q["shown_wait_s"]), _p(q["real_wait_s"]),
                  f"{q['queued']} queued; real-shown p50 {_p(q['real_minus_shown_s'])}")
    table.add_row("rate offered / completed per s", _f(t["offered_per_s"], 2), _f(t["completed_per_s"], 2),
                  f"over {t['wall_s']} s")
    table.add_row("tokens delivered per s (run, busiest 10% of s)", _f(t["tokens_delivered_per_s"]),
                  _f(t["tokens_per_s_p90_second"]),
                  f"generated {r['tokens']['generated']:,}, delivered {r['tokens']['delivered']:,}")
    table.add_row("Kafka records per token", _f(r["kafka"]["records_per_token"], 3), "",
                  f"{r['kafka']['token_records']:,} on chat.tokens")
    table.add_row("Cassandra statements per request", _f(r["cassandra"]["per_request"], 2), "",
                  f"{r['cassandra']['statements']:,} in all")
    table.add_row("errors", "", "", ", ".join(f"{k} {v}" for k, v in req["errors"].items()) or "none")
    return table


def cpu_table(r: dict[str, Any]) -> Table:
    cpu = r["cpu"]
    table = Table(title=f"CPU over {cpu['window_s']} s, less each process's idle rate "
                        f"(measured over {cpu['idle_window_s']} s first)")
    for col in ("process", "CPU s", "idle cores", "cores", "ms/request", "ms/token"):
        table.add_column(col, justify="left" if col == "process" else "right")
    for name, row in sorted(cpu["processes"].items(), key=lambda kv: -kv[1]["less_idle_s"]):
        table.add_row(name, _f(row["less_idle_s"], 2), _f(row["idle_cores"], 3), _f(row["cores"], 2),
                      _f(row["ms_per_request"], 2), _f(row["ms_per_token"], 4))
    for label, key in (("service", "service"), ("service less backbone", "without_backbone")):
        s = cpu[key]
        table.add_row(f"[bold]{label}[/bold]", _f(s["less_idle_s"], 2), "", "", _f(s["ms_per_request"], 2),
                      _f(s["ms_per_token"], 4))
    sim = cpu.get("engine", {})
    if sim.get("cpu_s"):
        table.add_row("  of which the simulated engine", _f(sim["cpu_s"], 2), "", "", _f(sim["ms_per_request"], 2),
                      _f(sim["ms_per_token"], 4))
    return table


def hops_table(r: dict[str, Any]) -> Table:
    hops = r["hops_ms"]
    table = Table(title=f"time to first token by hop, ms ({hops['n']} requests, from the events' timestamps)")
    table.add_column("hop")
    table.add_column("p50", justify="right")
    table.add_column("p99", justify="right")
    table.add_column("budget (p50, one stream)", justify="right")
    table.add_column("p50 / budget", justify="right")
    for hop, v in hops.items():
        if hop != "n":
            budget = BUDGET_MS.get(hop)
            table.add_row(hop, _f(v["p50"]), _f(v["p99"]), _f(budget) if budget else "-",
                          f"{v['p50'] / budget:.2f}" if budget else "-")
    pipeline = [v["p50"] for hop, v in hops.items() if hop in BUDGET_MS]
    table.add_row("pipeline (all but the engine)", _f(sum(pipeline)), "", _f(sum(BUDGET_MS.values())),
                  f"{sum(pipeline) / sum(BUDGET_MS.values()):.2f}")
    return table


def scenario_table(name: str, rows: list[dict[str, Any]]) -> Table:
    """Every step of a scenario side by side (rows from ``report.headline`` plus ``step``)."""
    table = Table(title=f"scenario {name}")
    cols = ("step", "done", "TTFT p50/p99 ms", "ITL p50/p99 ms", "tok/s", "events/s", "CPU ms/req", "CPU ms/tok",
            "rec/tok", "stmt/req", "busiest (cores)")
    for col in cols:
        table.add_column(col, justify="left" if col == "step" else "right")
    for r in rows:
        busy = max(((n, c) for n, c in r["cores"].items() if n != "loadgen"), key=lambda nc: nc[1] or 0.0,
                   default=("-", None))
        table.add_row(r["step"], f"{r['completed']}/{r['sent']}", f"{_f(r['ttft_ms_p50'])}/{_f(r['ttft_ms_p99'])}",
                      f"{_f(r['itl_ms_p50'])}/{_f(r['itl_ms_p99'])}", _f(r["tokens_per_s"]), _f(r["events_per_s"]),
                      _f(r["cpu_ms_per_request"], 1), _f(r["cpu_ms_per_token"], 3), _f(r["records_per_token"], 3),
                      _f(r["statements_per_request"], 1), f"{busy[0]} ({_f(busy[1], 2)})")
    return table
