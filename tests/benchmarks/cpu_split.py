"""CPU seconds per process across a benchmark phase, per 1,000 delivered tokens: where the machine's
CPU goes. Counts come from ``/proc/<pid>/stat`` (utime + stime), so they hold on a loaded machine where
wall-clock figures do not.

Processes are found by what started them: the benchmark's own service processes (their Python side
only), each worker's or vLLM server's child processes (vLLM's EngineCore, one per engine), and the
backbone's pid files under ``settings.state_dir/run``. The backbone is shared with whatever else runs on
this machine, so its figures are an upper bound on this benchmark's share.
"""
from __future__ import annotations

from typing import Any

import psutil

from infra.config.settings import Settings
from tests.benchmarks.profiling import cpu_seconds

BACKBONE = ("kafka", "cassandra", "redis")
ENGINE = "engine core"  # rows whose name starts with this are the engine; everything else is the pipeline


def backbone_pids(settings: Settings) -> dict[str, int]:
    out = {}
    for name in BACKBONE:
        path = settings.state_dir / "run" / f"{name}.pid"
        try:
            pid = int(path.read_text().split()[0])
        except (OSError, ValueError, IndexError):
            continue
        if psutil.pid_exists(pid):
            out[name] = pid
    return out


def with_children(python_side: dict[str, int], engine_hosts: tuple[str, ...]) -> dict[str, int]:
    """Each process by name, plus the descendants of ``engine_hosts`` named ``engine core (<parent>) <n>``."""
    out = dict(python_side)
    for name, pid in python_side.items():
        if name not in engine_hosts:
            continue
        try:
            kids = psutil.Process(pid).children(recursive=True)
        except psutil.Error:
            continue
        for i, kid in enumerate(kids):
            out[f"{ENGINE} ({name}) {i}" if len(kids) > 1 else f"{ENGINE} ({name})"] = kid.pid
    return out


def snapshot(pids: dict[str, int]) -> dict[str, float]:
    out = {}
    for name, pid in pids.items():
        try:
            out[name] = cpu_seconds(pid)
        except OSError:  # gone: counted as nothing from here on
            continue
    return out


def idle_rates(pids: dict[str, int], seconds: float = 10.0) -> dict[str, float]:
    """Each process's CPU (cores) with no request in flight: polling, heartbeats, timers."""
    import time

    before = snapshot(pids)
    time.sleep(seconds)
    after = snapshot(pids)
    return {n: round(max(after[n] - b, 0.0) / seconds, 4) for n, b in before.items() if n in after}


def split(before: dict[str, float], after: dict[str, float], tokens: int, seconds: float,
          idle: dict[str, float] | None = None) -> dict[str, Any]:
    """Per process: CPU seconds, share of one core, ms per 1,000 delivered tokens; plus the pipeline's and
    the engine's totals, and (given each process's ``idle`` rate in cores) the pipeline's less what it would
    have spent idle over the same time: the cost the tokens added."""
    rows = {}
    for name, start in before.items():
        if name in after:
            used = max(after[name] - start, 0.0)
            rows[name] = {"cpu_s": round(used, 3), "cores": round(used / seconds, 3) if seconds else 0.0,
                          "ms_per_1k_tokens": round(used * 1e6 / tokens, 1) if tokens else float("nan")}
    engine = sum(r["cpu_s"] for n, r in rows.items() if n.startswith(ENGINE))
    backbone = sum(r["cpu_s"] for n, r in rows.items() if n in BACKBONE)
    pipeline = sum(r["cpu_s"] for n, r in rows.items() if not n.startswith(ENGINE))
    idle_pipeline = sum(c for n, c in (idle or {}).items() if n in rows and not n.startswith(ENGINE)) * seconds
    idle_own = sum(c for n, c in (idle or {}).items() if n in rows and not n.startswith(ENGINE)
                   and n not in BACKBONE) * seconds
    out = {"tokens": tokens, "seconds": round(seconds, 2), "processes": rows,
           "engine_ms_per_1k": _per_1k(engine, tokens), "pipeline_ms_per_1k": _per_1k(pipeline, tokens),
           "pipeline_without_backbone_ms_per_1k": _per_1k(pipeline - backbone, tokens)}
    if idle is not None:
        out["idle_cores"] = idle
        out["pipeline_less_idle_ms_per_1k"] = _per_1k(max(pipeline - idle_pipeline, 0.0), tokens)
        out["pipeline_without_backbone_less_idle_ms_per_1k"] = _per_1k(max(pipeline - backbone - idle_own, 0.0),
                                                                       tokens)
    return out


def _per_1k(cpu_s: float, tokens: int) -> float:
    return round(cpu_s * 1e6 / tokens, 1) if tokens else float("nan")


def print_split(side: str, level: int, s: dict[str, Any]) -> None:
    print(f"\n   CPU, {side} c={level}: {s['tokens']} tokens in {s['seconds']} s")
    print("   | process | CPU s | cores | ms per 1k tokens |\n   |---|---|---|---|")
    for name, r in sorted(s["processes"].items(), key=lambda kv: -kv[1]["cpu_s"]):
        print(f"   | {name} | {r['cpu_s']:.2f} | {r['cores']:.2f} | {r['ms_per_1k_tokens']:.0f} |")
    print(f"   engine {s['engine_ms_per_1k']} ms/1k tokens; everything else {s['pipeline_ms_per_1k']} ms/1k "
          f"({s['pipeline_without_backbone_ms_per_1k']} without the shared backbone)")
    if "pipeline_less_idle_ms_per_1k" in s:
        print(f"   less each process's idle rate: everything else {s['pipeline_less_idle_ms_per_1k']} ms/1k "
              f"({s['pipeline_without_backbone_less_idle_ms_per_1k']} without the shared backbone)")


def engine_cpus(pids: dict[str, int]) -> set[int]:
    """The CPUs the engine cores' compute threads are bound to (vLLM binds its OpenMP threads itself)."""
    bound: set[int] = set()
    for name, pid in pids.items():
        if not name.startswith(ENGINE):
            continue
        try:
            for thread in psutil.Process(pid).threads():
                cpus = psutil.Process(thread.id).cpu_affinity() if psutil.pid_exists(thread.id) else []
                if cpus and len(cpus) < psutil.cpu_count():
                    bound.update(cpus)
        except psutil.Error:
            continue
    return bound


def place(pids: dict[str, int], cpus: set[int]) -> dict[int, list[int]]:
    """Pin every thread of every process in ``pids`` that is not an engine core to ``cpus``; the affinity each
    thread had, to put back with ``unplace``."""
    before: dict[int, list[int]] = {}
    for name, pid in pids.items():
        if name.startswith(ENGINE):
            continue
        try:
            threads = [t.id for t in psutil.Process(pid).threads()]
        except psutil.Error:
            continue
        for tid in threads:
            try:
                before[tid] = psutil.Process(tid).cpu_affinity()
                psutil.Process(tid).cpu_affinity(sorted(cpus))
            except psutil.Error:
                continue
    return before


def unplace(before: dict[int, list[int]]) -> None:
    for tid, cpus in before.items():
        try:
            psutil.Process(tid).cpu_affinity(cpus)
        except psutil.Error:
            continue
