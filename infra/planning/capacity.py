"""The seed's capacity model for one LLM chat service, every input a flag.

Pure arithmetic: `Inputs` -> `figures()` -> `Figures`; `checks()` sets each figure beside the number the
design states, and `notes()` says where a stated number does not follow from the stated assumptions.
`parley capacity` prints the table (rich) or, with --json, all of it as one object.

Decode time is modelled as memory traffic: a step reads all the weights plus the KV cache of every
sequence in the batch, at the replica's memory bandwidth. That one assumption reproduces both the seed's
18 ms step alone and its 36 ms step at 183 sequences, so a planner can change the GPU or the model.
"""

from __future__ import annotations

import argparse
import json
import math
from dataclasses import asdict, dataclass, fields
from decimal import ROUND_HALF_UP, Decimal

GB = 10**9  # the seed's GB are decimal...
KB = 1024  # ...but its KB are binary: only that mix gives its 458,000 tokens and its 330 MB prefix
MB = 10**6


@dataclass(frozen=True)
class Inputs:
    weights_gb: float = 140.0
    hbm_tb_per_s: float = 8.0  # not stated in the seed: the bandwidth its 18 ms step implies
    step_ms: float | None = None  # a measured full-batch step overrides the derived one
    kv_kb_per_token: float = 320.0
    free_gb: float = 150.0
    reserve_tokens: int = 4000
    avg_tokens: int = 2500
    prefix_tokens: int = 1000
    prompt_tokens: int = 1000
    prefill_s_per_1k: float = 0.14
    transfer_gb_per_s: float = 50.0
    replicas: int = 12
    peak_rps: float = 35.0
    service_rps: float = 50.0  # the seed's claim, used for the spike; notes() tests it
    spike_rps: float = 70.0
    spike_s: float = 60.0
    reply_tokens: int = 640  # not in the seed's sizing: the average reply of its quota example
    gpu_hour_usd: float = 2.50
    gpus: int = 48
    messages_per_day: int = 1_000_000


HELP: dict[str, str] = {
    "weights_gb": "weights read on every decode step, GB",
    "hbm_tb_per_s": "memory bandwidth per replica, TB/s (the seed's 18 ms implies ~8)",
    "step_ms": "measured decode step at the full batch, ms (default: derived from bandwidth)",
    "kv_kb_per_token": "KV cache per token, KB (binary, as the seed's figures need)",
    "free_gb": "memory left for the KV cache after weights and working memory, GB",
    "reserve_tokens": "tokens reserved per request without paging",
    "avg_tokens": "average tokens a request holds in the cache",
    "prefix_tokens": "shared system prompt, tokens",
    "prompt_tokens": "tokens prefilled per request",
    "prefill_s_per_1k": "prefill time per 1,000 prompt tokens, s",
    "transfer_gb_per_s": "network for moving a prefilled cache between replicas, GB/s",
    "replicas": "model replicas",
    "peak_rps": "peak requests per second",
    "service_rps": "fleet service rate for the spike, requests/s (the seed's claim; see notes)",
    "spike_rps": "spike arrival rate, requests/s",
    "spike_s": "spike length, s",
    "reply_tokens": "average reply, tokens",
    "gpu_hour_usd": "price per GPU-hour, USD",
    "gpus": "GPUs in the fleet",
    "messages_per_day": "messages per day",
}


@dataclass(frozen=True)
class Figures:
    step_alone_ms: float
    tokens_alone: float
    cache_tokens: float
    fit_reserved: int
    fit_paged: int
    paged_gain_pct: float
    step_batch_ms: float
    tokens_per_request: float
    tokens_per_replica: float
    batching_gain: float
    prefix_shared_mb: float
    prefix_private_gb: float
    prefix_private_pct: float
    prefill_s: float
    transfer_ms: float
    prefill_replicas: float
    spike_backlog: float
    spike_last_wait_s: float
    rps_decode_only: float
    rps_with_prefill: float
    reply_for_service_decode_only: float
    reply_for_service_with_prefill: float
    cost_hour_usd: float
    cost_day_usd: float
    cost_message_cents: float


def _step_ms(i: Inputs, batch: int) -> float:
    """One decode step: weights once, plus every sequence's cache, at memory bandwidth."""
    kv_bytes = batch * i.avg_tokens * i.kv_kb_per_token * KB
    return (i.weights_gb * GB + kv_bytes) / (i.hbm_tb_per_s * 10**12) * 1000


def figures(i: Inputs) -> Figures:
    kv_bytes = i.kv_kb_per_token * KB
    cache_tokens = i.free_gb * GB / kv_bytes
    fit_reserved = math.floor(cache_tokens / i.reserve_tokens)
    fit_paged = math.floor(cache_tokens / i.avg_tokens)
    step_alone = _step_ms(i, 0)
    step_batch = i.step_ms if i.step_ms is not None else _step_ms(i, fit_paged)
    per_replica = fit_paged * 1000 / step_batch
    prefill_s = i.prompt_tokens / 1000 * i.prefill_s_per_1k
    backlog = max(0.0, (i.spike_rps - i.service_rps) * i.spike_s)
    private_gb = fit_paged * i.prefix_tokens * kv_bytes / GB
    cost_day = i.gpus * i.gpu_hour_usd * 24
    return Figures(
        step_alone_ms=step_alone,
        tokens_alone=1000 / step_alone,
        cache_tokens=cache_tokens,
        fit_reserved=fit_reserved,
        fit_paged=fit_paged,
        paged_gain_pct=(fit_paged / fit_reserved - 1) * 100,
        step_batch_ms=step_batch,
        tokens_per_request=1000 / step_batch,
        tokens_per_replica=per_replica,
        batching_gain=per_replica / (1000 / step_alone),
        prefix_shared_mb=i.prefix_tokens * kv_bytes / MB,
        prefix_private_gb=private_gb,
        prefix_private_pct=private_gb / i.free_gb * 100,
        prefill_s=prefill_s,
        transfer_ms=i.prompt_tokens * kv_bytes / (i.transfer_gb_per_s * GB) * 1000,
        prefill_replicas=i.peak_rps * prefill_s,
        spike_backlog=backlog,
        spike_last_wait_s=backlog / i.service_rps,
        # A replica's time goes to decode (reply / tokens per s) and, unless prefill runs elsewhere,
        # to prefill, which stalls the whole batch: the seed counts it as replicas of its own (4.9).
        rps_decode_only=i.replicas * per_replica / i.reply_tokens,
        rps_with_prefill=i.replicas / (prefill_s + i.reply_tokens / per_replica),
        reply_for_service_decode_only=i.replicas * per_replica / i.service_rps,
        reply_for_service_with_prefill=(i.replicas / i.service_rps - prefill_s) * per_replica,
        cost_hour_usd=i.gpus * i.gpu_hour_usd,
        cost_day_usd=cost_day,
        cost_message_cents=cost_day / i.messages_per_day * 100,
    )


@dataclass(frozen=True)
class Check:
    key: str
    label: str
    unit: str
    seed: float  # the figure as the seed states it
    ndigits: int  # the seed's rounding: 0 = units, -3 = thousands


CHECKS: tuple[Check, ...] = (
    Check("step_alone_ms", "decode step, one request alone", "ms", 18, 0),
    Check("tokens_alone", "tokens/s, one request alone", "tok/s", 57, 0),
    Check("cache_tokens", "tokens the KV cache holds", "tokens", 458_000, -3),
    Check("fit_reserved", "requests that fit, 4,000-token reservations", "requests", 114, 0),
    Check("fit_paged", "requests that fit, paged (2,500 average)", "requests", 183, 0),
    Check("paged_gain_pct", "paging gain", "%", 60, -1),
    Check("step_batch_ms", "decode step at the full paged batch", "ms", 36, 0),
    Check("tokens_per_request", "tokens/s per request in that batch", "tok/s", 28, 0),
    Check("tokens_per_replica", "tokens/s per replica", "tok/s", 5_000, -3),
    Check("batching_gain", "batching gain over one at a time", "x", 88, 0),
    Check("prefix_shared_mb", "shared system-prompt cache", "MB", 330, -1),
    Check("prefix_private_gb", "private copies for the whole batch", "GB", 60, 0),
    Check("prefix_private_pct", "private copies, share of the cache", "%", 40, 0),
    Check("transfer_ms", "moving a 1,000-token prefill over the network", "ms", 7, 0),
    Check("prefill_replicas", "replicas of prefill compute at peak", "replicas", 4.9, 1),
    Check("rps_decode_only", "fleet req/s at full load, --reply-tokens, decode only", "req/s", 50, 0),
    Check("rps_with_prefill", "fleet req/s at full load, --reply-tokens, with prefill", "req/s", 50, 0),
    Check("spike_backlog", "spike backlog", "requests", 1_200, 0),
    Check("spike_last_wait_s", "last request's wait in the spike", "s", 24, 0),
    Check("cost_hour_usd", "cost per hour", "USD", 120, 0),
    Check("cost_day_usd", "cost per day", "USD", 2_880, 0),
    Check("cost_message_cents", "cost per message", "cents", 0.29, 2),
)


def seed_round(value: float, ndigits: int) -> float:
    """Half-up, as people round in prose (Python's round() would turn 17.5 into 18 but 60.5 into 60)."""
    step = Decimal(1).scaleb(-ndigits)
    return float(Decimal(repr(value)).quantize(step, rounding=ROUND_HALF_UP))


def checks(f: Figures) -> list[tuple[Check, float, bool]]:
    """Each seed figure beside the model's value, and whether they agree at the seed's rounding."""
    out = []
    for c in CHECKS:
        value = float(getattr(f, c.key))
        out.append((c, value, seed_round(value, c.ndigits) == c.seed))
    return out


def _note_units(i: Inputs, f: Figures) -> str:
    decimal = i.free_gb * GB / (i.kv_kb_per_token * 1000)
    binary = i.free_gb * 2**30 / (i.kv_kb_per_token * KB)
    prefix_decimal_mb = i.prefix_tokens * i.kv_kb_per_token * 1000 / MB
    return (
        f"Units: {i.free_gb:g} GB / {i.kv_kb_per_token:g} KB = {f.cache_tokens:,.0f} tokens (the seed's "
        f"458,000) only with decimal GB and binary KB (x 1,024 bytes); decimal both gives {decimal:,.0f}, "
        f"binary both {binary:,.0f}. Its 330 MB prefix also needs binary KB (decimal: {prefix_decimal_mb:,.0f} MB)."
    )


def _note_step(i: Inputs, f: Figures) -> str:
    return (
        f"18 ms and 57 tokens/s disagree: 1,000 / 18 = {1000 / 18:.1f}. 57 needs a {1000 / 57:.1f} ms step: "
        f"{i.weights_gb:g} GB read at {i.hbm_tb_per_s:g} TB/s = {f.step_alone_ms:.1f} ms, which the seed "
        f"rounds to 18. The same bandwidth gives its 36 ms step at 183 sequences (weights plus "
        f"{f.fit_paged} x {i.avg_tokens:,} tokens of cache per step = {f.step_batch_ms:.1f} ms) and its 88x "
        f"({f.batching_gain:.1f}x), so the model derives step times from bandwidth."
    )


def _note_service_rate(i: Inputs, f: Figures) -> str:
    return (
        "'At full load the 12 replicas serve about 50 requests a second' needs an average reply length the "
        f"sizing never states. A replica makes {f.tokens_per_replica:,.0f} tokens/s. With {i.reply_tokens}-token "
        f"replies (the seed's quota example) the fleet serves {f.rps_decode_only:.0f} req/s decoding only, or "
        f"{f.rps_with_prefill:.0f} req/s when each {i.prompt_tokens:,}-token prefill ({f.prefill_s:.2f} s, "
        f"stalling the batch) also takes replica time. {i.service_rps:g} req/s needs "
        f"{f.reply_for_service_decode_only:,.0f}-token replies (decode only) or "
        f"{f.reply_for_service_with_prefill:,.0f}-token replies (with prefill). The spike rows use "
        f"{i.service_rps:g} req/s as the seed does."
    )


def _note_prefill(i: Inputs, f: Figures) -> str:
    return (
        f"Prefill at peak: {i.peak_rps:g} req/s x {f.prefill_s:.2f} s = {f.prefill_replicas:.1f} replicas "
        f"(the seed's 4.9), so its count assumes {i.prompt_tokens:,} tokens prefilled per request; the "
        "prefill-inclusive rate uses the same."
    )


def notes(i: Inputs) -> list[str]:
    """Where the seed's numbers need an assumption it does not state, or do not follow at all."""
    f = figures(i)
    return [note(i, f) for note in (_note_units, _note_step, _note_service_rate, _note_prefill)]


def add_arguments(parser: argparse.ArgumentParser, name: str = "capacity") -> None:
    for f in fields(Inputs):
        flag = "--" + f.name.replace("_", "-")
        kind = float if f.name == "step_ms" else type(f.default)
        parser.add_argument(flag, type=kind, default=f.default, help=HELP[f.name])
    parser.add_argument("--json", action="store_true", help="print inputs, figures, checks and notes as JSON")


def inputs_from(args: argparse.Namespace) -> Inputs:
    return Inputs(**{f.name: getattr(args, f.name) for f in fields(Inputs)})


def as_json(i: Inputs) -> str:
    f = figures(i)
    rows = [
        {"key": c.key, "label": c.label, "unit": c.unit, "model": v, "seed": c.seed, "agrees": ok}
        for c, v, ok in checks(f)
    ]
    return json.dumps(
        {"inputs": asdict(i), "figures": asdict(f), "checks": rows, "notes": notes(i)}, indent=2
    )


def _fmt(value: float, ndigits: int) -> str:
    digits = max(ndigits, 0) + (1 if ndigits <= 0 and abs(value) < 100 else 0)
    return f"{value:,.{digits}f}"


def print_table(i: Inputs) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="Capacity model (seed 000 assumptions unless overridden)")
    for col in ("figure", "model", "seed", "unit", ""):
        table.add_column(col, justify="left" if col in ("figure", "unit") else "right")
    for c, value, ok in checks(figures(i)):
        table.add_row(c.label, _fmt(value, c.ndigits), f"{c.seed:,g}", c.unit, "ok" if ok else "[red]DIFFERS")
    console = Console()
    console.print(table)
    for n, note in enumerate(notes(i), 1):
        console.print(f"{n}. {note}", highlight=False)


def run(args: argparse.Namespace) -> int:
    i = inputs_from(args)
    if args.json:
        print(as_json(i))
    else:
        print_table(i)
    return 0
