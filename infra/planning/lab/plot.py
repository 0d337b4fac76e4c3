"""Draw lab runs as PNGs. Only this module imports matplotlib, and only with the Agg backend."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only: no display on a server or in CI
import matplotlib.pyplot as plt
from matplotlib.axes import Axes
from matplotlib.patches import Patch

from infra.planning.lab.fleet import FleetRun, queue_series
from infra.planning.lab.metrics import summarize
from infra.planning.lab.sim import Progress, Run

QUEUED, SHORT, LONG, UNFINISHED = "#c4c4c4", "#f2a541", "#2f6fd0", "#d62728"
LONG_REPLY_TOKENS = 300  # about half a page: where a reply starts to hold its slot for ten seconds or more


def _row(ax: Axes, y: int, p: Progress, end_s: float) -> None:
    start = p.admitted_s if p.admitted_s is not None else end_s
    ax.barh(y, start - p.request.arrival_s, left=p.request.arrival_s, height=0.8, color=QUEUED, lw=0)
    if p.admitted_s is not None:
        done = p.finished_s if p.finished_s is not None else end_s
        colour = LONG if p.request.reply_tokens >= LONG_REPLY_TOKENS else SHORT
        colour = UNFINISHED if p.finished_s is None else colour
        ax.barh(y, done - p.admitted_s, left=p.admitted_s, height=0.8, color=colour, lw=0)
    if p.finished_s is None:  # still waiting or generating when we stopped watching
        ax.plot([end_s], [y], marker="|", color=UNFINISHED, markersize=4)


TITLES = {
    "static": "Static batching",
    "continuous": "Continuous batching",
    "chunked": "Continuous + chunked prefill",
}


def _step_panels(batch: Axes, length: Axes, run: Run, cap: int, step_ms_top: float | None) -> None:
    """Batch size shows who may join; step length shows the stutter every streaming user feels."""
    starts = [s.start_s for s in run.steps]
    batch.step(starts, [len(s.seqs) for s in run.steps], where="post", color="#444444", lw=0.8)
    batch.axhline(cap, color=UNFINISHED, lw=0.6, ls="--")
    batch.set_ylim(0, cap + 2)
    batch.set_ylabel("in batch")
    length.step(
        starts, [(s.end_s - s.start_s) * 1000 for s in run.steps], where="post", color="#444444", lw=0.6
    )
    length.set_ylim(0, step_ms_top)
    length.set_ylabel("step ms")
    length.set_xlabel("seconds")


def plot_run(run: Run, path: Path, step_ms_top: float | None = None) -> Path:
    """One row per request; pass the same step_ms_top for every mode so their stutter compares by eye."""
    end_s = run.config.duration_s
    s = summarize(run)
    cap = run.config.static_max_seqs if run.mode == "static" else run.config.max_seqs
    rows = len(run.requests)
    fig, (ax, batch, length) = plt.subplots(
        3,
        1,
        figsize=(11, 3.5 + rows * 0.055),
        sharex=True,
        gridspec_kw={"height_ratios": [max(4, rows / 20), 1, 1]},
    )
    for y, p in enumerate(run.requests):
        _row(ax, y, p, end_s)
    ax.set_ylim(rows, -1)  # first arrival on top, time flows down and right
    ax.set_xlim(0, end_s)
    ax.set_ylabel("request (by arrival)")
    ax.set_title(
        f"{TITLES[run.mode]}, seed {run.config.seed}, {run.config.arrival_rps:g} req/s: "
        f"{s.completed}/{s.arrived} done, {s.tokens_per_s:.0f} tokens/s, TTFT p50 {s.ttft_p50_s:.2f} s "
        f"p95 {s.ttft_p95_s:.2f} s, longest step {s.longest_step_ms:.0f} ms",
        fontsize=9,
    )
    legend = [
        Patch(color=QUEUED, label="queued"),
        Patch(color=SHORT, label=f"generating, reply < {LONG_REPLY_TOKENS} tokens"),
        Patch(color=LONG, label=f"generating, reply >= {LONG_REPLY_TOKENS} tokens"),
        Patch(color=UNFINISHED, label=f"unfinished at {end_s:g} s"),
    ]
    ax.legend(handles=legend, loc="upper right", fontsize=8, framealpha=0.9)
    _step_panels(batch, length, run, cap, step_ms_top)
    return _save(fig, path)


def plot_fleet(limited: FleetRun, unlimited: FleetRun, path: Path) -> Path:
    c = limited.config
    fig, (ax, low) = plt.subplots(2, 1, figsize=(11, 6), sharex=True, gridspec_kw={"height_ratios": [3, 1]})
    ax.axvspan(
        c.spike_start_s, c.spike_start_s + c.spike_s, color="#fde0dd", label=f"{c.spike_rps:g} req/s spike"
    )
    ax.plot(*queue_series(unlimited), color="#888888", ls="--", lw=1.2, label="queue, no wait limit")
    ax.plot(*queue_series(limited), color=LONG, lw=1.6, label=f"queue, {c.wait_limit_s:g} s limit")
    ax.axhline(
        c.capacity_rps * (c.wait_limit_s or 0),
        color=UNFINISHED,
        lw=0.8,
        ls=":",
        label=f"queue that means a {c.wait_limit_s:g} s wait",
    )
    ax.set_ylabel("requests waiting")
    ax.set_title(
        f"{c.replicas} replicas at {c.capacity_rps:g} req/s, {c.base_rps:g} req/s base, seed {c.seed}: "
        f"{limited.overflowed} of {len(limited.requests)} overflow to the small model",
        fontsize=9,
    )
    ax.legend(loc="upper right", fontsize=8)
    times = [r.arrival_s for r in limited.requests if r.overflowed]
    low.hist(times, bins=int(c.duration_s), range=(0, c.duration_s), color=UNFINISHED)
    low.set_ylabel("overflow / s")
    low.set_xlabel("seconds")
    low.set_xlim(0, c.duration_s)
    return _save(fig, path)


def _save(fig: plt.Figure, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
