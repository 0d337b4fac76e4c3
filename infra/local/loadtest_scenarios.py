"""The load tests of issue 24, each bounded in time: which private service to start and what load to play.

A scenario is a list of steps; consecutive steps with the same service share one start. A stepped scenario
(``stages``, ``gateway``) raises the rate until a step is not sustained (``sustained``) and names the process
that saturated first. Rates are the seeds' scaled to this machine; ``rate_scale`` and ``duration_s`` shrink a
scenario further (the CI smoke run).
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from infra.local.loadtest_service import ServiceSpec, SimPool
from producers.loadgen.arrivals import Phase
from producers.loadgen.run import Load

# The small pool: a model about four times faster (the seeds), for titles and the free lane's overflow.
SMALL = SimPool(workers=1, max_num_seqs=64, sim={"weights_gb": 35.0, "kv_kb_per_token": 80.0})
REPLICA = SimPool(workers=1, max_num_seqs=183)


@dataclass(frozen=True)
class Step:
    label: str
    service: ServiceSpec
    load: Load
    stepped: bool = False  # part of a ramp: stop the ramp at the first step not sustained
    probe: str | None = None  # a pool whose replicas are measured one by one (``loadtest_routing``)
    leave_after_s: float | None = None  # one of its workers stops this far into the step


@dataclass(frozen=True)
class Knobs:
    duration_s: float | None = None  # each phase at most this long
    rate_scale: float = 1.0
    seed: int = 0
    repeat: int = 1  # the marginal scenario's pair of steps, played this many times in turn


def with_stream_interval(step: Step, interval: int) -> Step:
    """The step with every pool's engine handing over a reply's tokens every ``interval`` tokens."""
    pools = {name: replace(pool, stream_interval=interval) for name, pool in step.service.pools.items()}
    return replace(step, service=replace(step.service, pools=pools))


def with_flush_drain(step: Step, drain: bool) -> Step:
    """The step with every pool's reply loops taking their outputs at their flush tick, or at every output."""
    pools = {name: replace(pool, flush_drain=drain) for name, pool in step.service.pools.items()}
    return replace(step, service=replace(step.service, pools=pools))


def with_flush_groups(step: Step, groups: int) -> Step:
    """The step with every pool's flush clock ticking ``groups`` groups a window."""
    pools = {name: replace(pool, flush_groups=groups) for name, pool in step.service.pools.items()}
    return replace(step, service=replace(step.service, pools=pools))


def _shape(load: Load, knobs: Knobs) -> Load:
    phases = tuple(Phase(min(p.seconds, knobs.duration_s or p.seconds), p.rate * knobs.rate_scale)
                   for p in load.phases)
    return replace(load, phases=phases, seed=knobs.seed)


def _rates(load: Load) -> str:
    return " -> ".join(f"{p.rate:g}" for p in load.phases) + " req/s"


def replica(knobs: Knobs) -> list[Step]:
    """One sim replica (183 sequences, ~5,000 tok/s) at ~4 requests a second: a replica's share of 50 req/s."""
    service = ServiceSpec({"large": REPLICA, "small": SMALL})
    load = _shape(Load((Phase(60, 4.0),), drain_s=90), knobs)
    return [Step(_rates(load), service, load)]


def stages(knobs: Knobs) -> list[Step]:
    """Short replies on ample sim capacity, so the request path (admission -> persistence) is what is loaded."""
    service = ServiceSpec({"large": SimPool(workers=1, max_num_seqs=1000, sim={"reply_tokens": 32}), "small": SMALL})
    loads = [_shape(Load((Phase(20, rate),), max_tokens=32, max_turns=2, message_tokens=100, drain_s=30), knobs)
             for rate in (2, 4, 6, 8, 12, 16)]
    return [Step(_rates(load), service, load, stepped=True) for load in loads]


def gateway(knobs: Knobs) -> list[Step]:
    """Long replies, short one-turn prompts: SSE events a second through one gateway, raised until it stalls."""
    service = ServiceSpec({"large": SimPool(workers=1, max_num_seqs=600), "small": SMALL})
    loads = [_shape(Load((Phase(30, rate),), max_turns=1, message_tokens=50, drain_s=60), knobs)
             for rate in (2, 4, 6, 8, 12)]
    return [Step(_rates(load), service, load, stepped=True) for load in loads]


SPIKE_SEQS = 120  # one replica at a tenth of the seeds' 50 req/s: ~5 req/s at ~640 tokens and ~36 ms a step


def spike(knobs: Knobs) -> list[Step]:
    """The seeds' 35 -> 70 req/s for a minute at a tenth: 3.5 -> 7 req/s on a replica serving ~5."""
    service = ServiceSpec({"large": SimPool(workers=1, max_num_seqs=SPIKE_SEQS), "small": SMALL})
    load = _shape(Load((Phase(20, 3.5), Phase(60, 7.0), Phase(20, 3.5)), drain_s=90), knobs)
    return [Step(_rates(load), service, load)]


def spike_prediction(peak: float, served: float, seconds: float) -> dict[str, float]:
    """The capacity model's queue: (peak - served) x seconds waiting; the last waits that over ``served``."""
    waiting = max(peak - served, 0.0) * seconds
    return {"served_per_s": served, "waiting": round(waiting, 1), "last_wait_s": round(waiting / served, 1)}


def prefill(knobs: Knobs) -> list[Step]:
    """1,000-token prompts arriving on running streams: prefill unchunked, chunked at 256, disaggregated."""
    load = _shape(Load((Phase(40, 2.0),), max_turns=1, message_tokens=1000, drain_s=60), knobs)
    variants: list[tuple[str, dict[str, Any]]] = [("unchunked", {"prefill_chunk": 0}),
                                                 ("chunked 256", {"prefill_chunk": 256}),
                                                 ("disaggregated", {"prefill": "disaggregated"})]
    # A record per engine step, so the client's gaps show each step's stutter (a flush window would hide it).
    return [Step(label, ServiceSpec({"large": SimPool(workers=1, max_num_seqs=183, sim=sim, flush_ms=0.0),
                                     "small": SMALL}), load)
            for label, sim in variants]


def tokens(knobs: Knobs) -> list[Step]:
    """The replica's load with a record per engine step (the baseline), with the shipped flush window kept by
    each reply on its own, in groups with each reply's loop taking every engine output, and as shipped (in
    groups, each reply's loop taking its outputs at its group's tick)."""
    load = _shape(Load((Phase(60, 4.0),), drain_s=90), knobs)
    sides: tuple[tuple[str, float | None, bool | None, bool | None], ...] = (
        ("a record per step", 0.0, None, None), ("flush 100 ms, each reply on its own", None, False, None),
        ("flush 100 ms in groups, every output taken", None, None, False), ("flush 100 ms", None, None, None))
    return [Step(label, ServiceSpec({"large": replace(REPLICA, flush_ms=flush, flush_together=together,
                                                      flush_drain=drain), "small": SMALL}), load)
            for label, flush, together, drain in sides]


FLUSH_GROUPS = (4, 2, 1)  # the groups scenario's steps: how many groups the flush clock ticks a window


def groups(knobs: Knobs) -> list[Step]:
    """The replica's load (as ``tokens``) with the shipped flush window, its clock ticking four, two and one
    group a window: each halving makes half the Kafka requests (a produce, and a fetch for each reader, a
    tick), in bursts twice as large."""
    load = _shape(Load((Phase(60, 4.0),), drain_s=90), knobs)
    return [Step(f"flush 100 ms, {n} groups", ServiceSpec({"large": replace(REPLICA, flush_groups=n), "small": SMALL}),
                 load) for n in FLUSH_GROUPS]


MARGINAL_REPLIES = (320, 1280)  # tokens a reply runs to, about, on each side


def marginal(knobs: Knobs) -> list[Step]:
    """The same requests (one-turn conversations at 2 req/s) with replies of ~320 and ~1,280 tokens, shipped
    flush window: the CPU the longer replies add, over the tokens they add, is what a token costs; the rest is
    what a request costs."""
    load = _shape(Load((Phase(60, 2.0),), max_turns=1, drain_s=120), knobs)
    rounds = max(1, knobs.repeat)
    return [Step(f"replies ~{n} tokens" + (f" ({i + 1})" if rounds > 1 else ""),
                 ServiceSpec({"large": replace(REPLICA, sim={"reply_tokens": n}), "small": SMALL}), load)
            for i in range(rounds) for n in MARGINAL_REPLIES]


def split_cost(short: dict[str, Any], long: dict[str, Any]) -> dict[str, Any]:
    """CPU per token and per request, from two steps that differ only in their replies' length: per process,
    for the service and for the service less Kafka, Cassandra and Redis (ms)."""
    tokens = long["tokens_delivered"] - short["tokens_delivered"]
    out: dict[str, Any] = {"tokens_added": tokens}
    for name in short["cpu_s"]:
        if name not in long["cpu_s"] or tokens <= 0 or not short["completed"]:
            continue
        per_token = (long["cpu_s"][name] - short["cpu_s"][name]) / tokens
        per_request = (short["cpu_s"][name] - per_token * short["tokens_delivered"]) / short["completed"]
        out[name] = {"ms_per_token": round(per_token * 1e3, 4), "ms_per_request": round(per_request * 1e3, 1)}
    return out


def split_costs(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """``split_cost`` of each (short, long) pair of steps in turn, and per process the mean of the pairs with
    their lowest and highest: one pair's figure moves with whatever else the machine did in those minutes."""
    splits = [split_cost(short, long) for short, long in zip(rows[0::2], rows[1::2], strict=False)]
    out: dict[str, Any] = {"pairs": len(splits), "tokens_added": sum(s["tokens_added"] for s in splits)}
    for name in (splits[0] if splits else {}):
        runs = [s[name] for s in splits if isinstance(s.get(name), dict)]
        if name == "tokens_added" or len(runs) != len(splits):
            continue
        tokens = [r["ms_per_token"] for r in runs]
        out[name] = {"ms_per_token": round(sum(tokens) / len(tokens), 4), "min": min(tokens), "max": max(tokens),
                     "ms_per_request": round(sum(r["ms_per_request"] for r in runs) / len(runs), 1)}
    return out


# Routing: four replicas whose prefill is 7x the seeds' replica's (1 s per 1,000 tokens), so this machine's few
# requests a second load their prefill as ~20 would load the seeds' replicas; short replies, long multi-turn
# conversations (up to 8 turns of ~300-token messages: prompts up to ~3,000 tokens).
ROUTED = SimPool(workers=4, max_num_seqs=64, sim={"prefill_s_per_1k": 1.0, "reply_tokens": 64})


def routing(knobs: Knobs) -> list[Step]:
    """The same multi-turn load on four replicas under each routing policy, then a worker leaving mid-run."""
    load = _shape(Load((Phase(60, 3.0),), max_tokens=64, max_turns=8, follow_share=0.9, drain_s=60), knobs)
    leave = (load.phases[0].seconds / 2) if load.phases else None

    def spec(policy: str) -> ServiceSpec:
        return ServiceSpec({"large": replace(ROUTED, routing=policy), "small": SMALL})

    return [*(Step(policy, spec(policy), load, probe="large") for policy in ("random", "conversation", "cache-aware")),
            Step("cache-aware, a worker leaves", spec("cache-aware"), load, probe="large", leave_after_s=leave)]


def latency(knobs: Knobs) -> list[Step]:
    """About one stream at a time (0.5 req/s of 32-token replies, one-turn prompts): each hop's p50 against its
    budget (``producers.loadgen.hops.BUDGET_MS``)."""
    service = ServiceSpec({"large": SimPool(workers=1, max_num_seqs=16, sim={"reply_tokens": 32}), "small": SMALL})
    load = _shape(Load((Phase(60, 0.5),), max_tokens=32, max_turns=1, message_tokens=50, drain_s=20), knobs)
    return [Step(_rates(load), service, load)]


SCENARIOS: dict[str, Callable[[Knobs], list[Step]]] = {
    "replica": replica, "stages": stages, "gateway": gateway, "spike": spike, "prefill": prefill,
    "tokens": tokens, "routing": routing, "latency": latency, "marginal": marginal,
    "groups": groups}


PIPELINE_GROUPS = ("admission", "prompt", "scheduler", "settlement", "persistence")


def sustained(report: dict[str, Any], ttft_limit_ms: float = 5000.0) -> bool:
    """Did the service keep up with this step: nearly all arrivals completed at the offered rate, first tokens
    within ``ttft_limit_ms`` at the median, and no lag left standing at the end in the groups from admission
    to persistence."""
    req = report["requests"]
    if not req["sent"] or (req["completed"] / req["sent"]) < 0.95:
        return False
    if (report["client"]["ttft_ms"].get("p50") or 0.0) > ttft_limit_ms:
        return False
    offered = report["throughput"]["offered_per_s"] or 0.0
    stuck = sum(v["last"] for k, v in report["lag"].items() if k in PIPELINE_GROUPS)
    return stuck <= max(10.0, offered * 2)


def busiest(report: dict[str, Any]) -> str | None:
    """The service process that used the most cores during the step (the one closest to saturating)."""
    rows = {n: r for n, r in report["cpu"]["processes"].items() if n != "loadgen"}
    return max(rows, key=lambda n: rows[n]["cores"] or 0.0) if rows else None
