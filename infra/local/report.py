"""``parley report``: a picture of a run, drawn from Prometheus' query API.

Four panels over the last ``--minutes``: TTFT p50/p95 by plan, tokens/s by plan, queue time p50/p95 by
lane, KV-cache use by pool. Each panel is one PromQL range query (the expressions of the recording rules
in infra/local/prometheus.py, so the picture, the dashboard and the tests agree). Writes a PNG.
"""
from __future__ import annotations

import argparse
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from infra.config.settings import Settings
from infra.local.prometheus import RULES


@dataclass(frozen=True)
class Panel:
    title: str
    unit: str
    queries: tuple[tuple[str, str], ...]  # (legend prefix, PromQL)


PANELS = (
    Panel("time to first token (gateway, end to end)", "s",
          (("p50", RULES["parley:ttft_seconds:p50"]), ("p95", RULES["parley:ttft_seconds:p95"]))),
    Panel("tokens per second", "tokens/s", (("", RULES["parley:tokens_per_second:rate"]),)),
    Panel("queue time (enqueued -> picked up)", "s",
          (("p50", RULES["parley:queue_seconds:p50"]), ("p95", RULES["parley:queue_seconds:p95"]))),
    Panel("KV-cache use", "fraction", (("", RULES["parley:kv_cache_usage:ratio"]),)),
)


def query_range(base_url: str, expr: str, start: float, end: float, step_s: float) -> list[dict[str, Any]]:
    """The ``result`` of /api/v1/query_range: one {metric, values} per series."""
    response = httpx.get(f"{base_url}/api/v1/query_range",
                         params={"query": expr, "start": start, "end": end, "step": step_s}, timeout=30)
    response.raise_for_status()
    body = response.json()
    if body.get("status") != "success":
        raise RuntimeError(f"Prometheus refused {expr!r}: {body.get('error')}")
    return list(body["data"]["result"])


def _label(prefix: str, metric: dict[str, str]) -> str:
    labels = ",".join(f"{v}" for k, v in sorted(metric.items()) if k != "__name__")
    return " ".join(x for x in (prefix, labels) if x) or "all"


def render(base_url: str, out: Path, minutes: float, end: float | None = None) -> dict[str, int]:
    """Draw the panels into ``out``; returns how many series each panel had (0: nothing measured)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    end = time.time() if end is None else end
    start = end - minutes * 60
    step = max(5.0, minutes * 60 / 240)
    fig, axes = plt.subplots(len(PANELS), 1, figsize=(10, 3 * len(PANELS)), sharex=True)
    counts: dict[str, int] = {}
    for ax, panel in zip(axes, PANELS, strict=True):
        n = 0
        for prefix, expr in panel.queries:
            for series in query_range(base_url, expr, start, end, step):
                points = [(float(t) - end, float(v)) for t, v in series["values"] if v not in ("NaN", "+Inf", "-Inf")]
                if points:
                    xs, ys = zip(*points, strict=True)
                    ax.plot([x / 60 for x in xs], ys, label=_label(prefix, series["metric"]))
                    n += 1
        counts[panel.title] = n
        ax.set_title(panel.title)
        ax.set_ylabel(panel.unit)
        ax.grid(alpha=0.3)
        if n:
            ax.legend(fontsize=8, loc="upper left")
        else:
            ax.text(0.5, 0.5, "no samples in this window", ha="center", va="center", transform=ax.transAxes)
    axes[-1].set_xlabel("minutes before " + time.strftime("%H:%M:%S UTC", time.gmtime(end)))
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=90)
    plt.close(fig)
    return counts


def add_arguments(parser: argparse.ArgumentParser, name: str) -> None:
    parser.add_argument("--minutes", type=float, default=15.0, help="how far back (default %(default)s)")
    parser.add_argument("--prometheus", default=None, help="base URL (default: `up --with-prometheus`'s)")
    parser.add_argument("--out", type=Path, default=None, help="PNG path (default: <state>/reports/report-<time>.png)")


def run(args: argparse.Namespace) -> int:
    settings = Settings.from_env()
    base = args.prometheus or f"http://{settings.host}:{settings.ports.prometheus}"
    out = args.out or settings.state_dir / "reports" / time.strftime("report-%Y%m%d-%H%M%S.png")
    try:
        counts = render(base, out, args.minutes)
    except httpx.HTTPError as exc:
        print(f"parley report: Prometheus at {base} did not answer ({type(exc).__name__}); "
              "start it with `parley up --with-prometheus`")
        return 1
    for title, n in counts.items():
        print(f"  {title}: {n} series")
    print(f"report written to {out}")
    return 0
