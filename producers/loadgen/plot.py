"""A PNG of the run's time series: arrivals and completions, streams in flight against the engine's batch, the
client's TTFT and ITL per second, tokens a second and the stages' consumer lag (matplotlib, if installed)."""
from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any

from producers.loadgen.record import RequestRecord
from producers.loadgen.stats import pct


def per_second(records: list[RequestRecord], started: float) -> dict[str, dict[int, float]]:
    """Series keyed by whole seconds from the start (pure): sends, completions, TTFT p50, ITL p99, tokens."""
    sends: dict[int, float] = defaultdict(float)
    ends: dict[int, float] = defaultdict(float)
    tokens: dict[int, float] = defaultdict(float)
    ttft: dict[int, list[float]] = defaultdict(list)
    gaps: dict[int, list[float]] = defaultdict(list)
    for r in records:
        sends[int(r.sent - started)] += 1
        if r.ok:
            ends[int(r.done - started)] += 1
        if r.ttft is not None:
            ttft[int(r.sent - started)].append(r.ttft * 1000)
        share = r.tokens_out / len(r.deltas) if r.deltas and r.tokens_out else 1.0
        for a, b in zip(r.deltas, r.deltas[1:], strict=False):
            gaps[int(b - started)].append((b - a) * 1000)
        for d in r.deltas:
            tokens[int(d - started)] += share
    return {"sent": dict(sends), "completed": dict(ends), "tokens": dict(tokens),
            "ttft_p50": {k: pct(v, 50) for k, v in ttft.items()}, "itl_p99": {k: pct(v, 99) for k, v in gaps.items()}}


def draw(path: Path, records: list[RequestRecord], started: float, samples: list[dict[str, Any]],
         title: str) -> Path | None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    series = per_second(records, started)
    fig, axes = plt.subplots(4, 1, figsize=(11, 12), sharex=True)
    _line(axes[0], series["sent"], "arrivals/s", fill=True)
    _line(axes[0], series["completed"], "completed/s", fill=True)
    axes[0].set_ylabel("requests/s")
    ts = [s["t"] for s in samples]
    axes[1].plot(ts, [s["in_flight"] for s in samples], label="client streams open")
    for key in sorted({k for s in samples for k in s if k.endswith((".running", ".waiting"))}):
        axes[1].plot(ts, [s.get(key, 0) for s in samples], label=f"engine {key}")
    axes[1].set_ylabel("sequences")
    _line(axes[2], series["ttft_p50"], "TTFT p50 (by send second)")
    _line(axes[2], series["itl_p99"], "ITL p99")
    axes[2].set_ylabel("ms")
    axes[2].set_yscale("log")
    _line(axes[3], series["tokens"], "tokens delivered/s", fill=True)
    axes[3].set_ylabel("tokens/s")
    lag_ax = axes[3].twinx()
    for group in sorted({g for s in samples for g in s.get("lag", {})}):
        lag_ax.plot(ts, [s.get("lag", {}).get(group, 0) for s in samples], "--", label=f"lag {group}")
    lag_ax.set_ylabel("consumer lag (records)")
    for ax in axes:
        if ax.get_legend_handles_labels()[0]:
            ax.legend(loc="upper left", fontsize=8)
    if lag_ax.get_legend_handles_labels()[0]:
        lag_ax.legend(loc="upper right", fontsize=7, ncol=2)
    axes[-1].set_xlabel("seconds from the first arrival")
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def _line(ax: Any, series: dict[int, float], label: str, fill: bool = False) -> None:
    """One series; ``fill``: a count, so a second with nothing in it is a zero, not a gap."""
    xs = list(range(min(series), max(series) + 1)) if fill and series else sorted(series)
    ax.plot(xs, [series.get(x, 0.0) for x in xs], label=label)
