"""Shared pieces of the benchmarks: percentiles, JSON results, private service processes, users,
the prompts every side sends, and a tap on ``chat.tokens`` that timestamps each event on receipt.

Everything runs on loopback against the running backbone, on a topic prefix and keyspace of the
benchmarks' own; processes are started with the same commands ``parley up`` uses.
"""
from __future__ import annotations

import asyncio
import itertools
import json
import os
import platform
import signal
import statistics
import subprocess
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiokafka.admin import AIOKafkaAdminClient

from infra.config.pools import load_pools
from infra.config.settings import Settings
from schemas import EventDecodeError, GenerationFinished, TokensAppended, decode_record
from tests.e2e.service import Proc, Service
from topics import Topics
from topics.admin import ensure_topics_async
from topics.clients import assign_at_end, make_consumer

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "bench-results"
PLANS = Path(__file__).with_name("plans.toml")
KEYSPACE = os.environ.get("PARLEY_BENCH_KEYSPACE", "parley_bench")

# Long-reply requests, so most replies run to the cap and both sides of a comparison make the same work.
TOPICS = ["a lighthouse keeper", "a dragon who bakes bread", "the first city on Mars", "a lost violin",
          "a robot gardener", "a river that flows uphill", "a chess match between two ghosts",
          "a librarian who can read minds", "a storm over the desert", "a clockmaker's apprentice",
          "a whale who sings opera", "a village without shadows", "a train that never stops",
          "a painter who paints the future", "an island made of glass", "a fox who learns to count"]


# -- numbers ---------------------------------------------------------------------------------------------
def pct(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100), linear between ranks; NaN for no values."""
    if not values:
        return float("nan")
    xs = sorted(values)
    k = (len(xs) - 1) * q / 100
    lo, hi = int(k), min(int(k) + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def summary(values: Sequence[float], scale: float = 1.0) -> dict[str, float]:
    """n, p50, p95, p99, mean (times ``scale``, e.g. 1000 for ms), rounded for reading."""
    vs = [v * scale for v in values]
    return {"n": len(vs), "p50": round(pct(vs, 50), 2), "p95": round(pct(vs, 95), 2),
            "p99": round(pct(vs, 99), 2), "mean": round(statistics.fmean(vs), 2) if vs else float("nan")}


def ratio(a: float, b: float) -> float:
    return round(a / b, 3) if b else float("nan")


def write_result(name: str, payload: dict[str, Any]) -> Path:
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / f"{name}.json"
    payload = {"benchmark": name, "taken_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "host": platform.node(),
               "cpus": os.cpu_count(), "load_avg_1m": os.getloadavg()[0], **payload}
    path.write_text(json.dumps(payload, indent=2, default=str) + "\n")
    print(f"results: {path.relative_to(ROOT)}")
    return path


def header(title: str, **fields: Any) -> None:
    print(f"== {title}")
    print("   " + "  ".join(f"{k}={v}" for k, v in fields.items()))
    print(f"   host cpus={os.cpu_count()} load_avg_1m={os.getloadavg()[0]:.1f} (other runs share this machine)")


# -- settings, topics, processes ---------------------------------------------------------------------------
async def bench_settings(tag: str) -> Settings:
    """The running stack, with the benchmarks' keyspace (migrated) and a fresh topic prefix (created)."""
    from infra.stores.cql.migrate import apply

    settings = Settings.from_env().with_(keyspace=KEYSPACE, topic_prefix=f"b{tag}{uuid.uuid4().hex[:6]}.")
    apply(settings)
    await ensure_topics_async(settings.kafka_bootstrap, settings.topic_prefix, load_pools(settings))
    return settings


def plans_file(reply_cap: int) -> Path:
    """``plans.toml`` with its reply cap set to ``reply_cap`` (written under bench-results/ if it differs)."""
    text = PLANS.read_text()
    if f"reply_cap = {reply_cap}\n" in text:
        return PLANS
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / f"plans-cap{reply_cap}.toml"
    path.write_text(text.replace("reply_cap = 128\n", f"reply_cap = {reply_cap}\n"))
    return path


def service(settings: Settings, name: str, **env: str) -> Service:
    """A way to start Parley's processes on this run's prefix; logs in bench-results/logs/<name>/."""
    log_dir = RESULTS / "logs" / name
    log_dir.mkdir(parents=True, exist_ok=True)
    full = dict(os.environ, PARLEY_TOPIC_PREFIX=settings.topic_prefix, PARLEY_KEYSPACE=settings.keyspace,
                PYTHONUNBUFFERED="1", **env)
    return Service(settings, full, log_dir)


def start_worker(svc: Service, pool: str = "large", capacity: int | None = None, timeout: float = 600) -> Proc:
    # Metrics on any free port: the pool's fixed one may be taken by a running `parley up`.
    args = ["worker", "--pool", pool, "--metrics-port", "0"] + (["--capacity", str(capacity)] if capacity else [])
    proc = svc.start(f"worker-{pool}", *args)
    svc.wait_log(proc, "worker ready", timeout)
    return proc


def start_pipeline(svc: Service, with_small: bool = False, timeout: float = 600) -> None:
    """Stages, one gateway (``gateway-a``) and the large worker (plus the small one if asked)."""
    stages = svc.start("stages", "stages", "--metrics-port", "0")
    svc.start_gateway("gateway-a")
    svc.wait_log(stages, "stages ready", 300)
    for pool in ("large", "small") if with_small else ("large",):
        start_worker(svc, pool, timeout=timeout)


def stop_service(svc: Service) -> None:
    """SIGTERM each process (last started first), SIGKILL whatever is still there after 30 s."""
    for proc in reversed(list(svc.procs.values())):
        if proc.popen.poll() is None:
            try:
                proc.kill(signal.SIGTERM)
            except subprocess.TimeoutExpired:
                proc.kill(signal.SIGKILL)


async def delete_topics(settings: Settings) -> None:
    """Drop this run's topics (everything under its prefix)."""
    admin = AIOKafkaAdminClient(bootstrap_servers=settings.kafka_bootstrap)
    await admin.start()
    try:
        names = [n for n in await admin.list_topics() if n.startswith(settings.topic_prefix)]
        if names:
            await admin.delete_topics(names)
    finally:
        await admin.close()


# -- users and prompts -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class User:
    user_id: str
    token: str


async def make_users(settings: Settings, plan: str, n: int) -> list[User]:
    from infra.stores.accounts import Accounts
    from infra.stores.session import AsyncSession, connect

    cluster, session = connect(settings)
    try:
        accounts = Accounts(AsyncSession(session))
        made = [await accounts.create_user(plan, "bench") for _ in range(n)]
    finally:
        cluster.shutdown()
    return [User(u.user_id, token) for u, token in made]


def story_request(i: int) -> str:
    return f"Request {i}: write a long, detailed story about {TOPICS[i % len(TOPICS)]}. Use many paragraphs."


def tokenizer() -> Any:
    from consumers.prompt.tokenizer import tokenizer_for
    from infra.config.pools import default_model_dir

    return tokenizer_for(str(default_model_dir(Settings.from_env())))


def pipeline_prompt(text: str) -> list[int]:
    """The ids the prompt stage builds for the first turn of a new conversation (shared system prompt)."""
    from consumers.prompt.fit import Turn, fit

    tok = tokenizer()
    fitted = fit([Turn(0, text, None)], tok.count, Settings.from_env().prompt_budget_tokens)
    return tok.chat_ids(fitted.messages)


# -- one request's timeline, on either side of a comparison ------------------------------------------------
@dataclass
class Timeline:
    sent: float
    chunks: list[tuple[float, int]] = field(default_factory=list)  # (received, tokens) per engine step/delta
    done: float = 0.0
    tokens: int = 0  # completion tokens (from usage when the side reports it)
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def ttft(self) -> float:
        return self.chunks[0][0] - self.sent if self.chunks else float("nan")

    def gaps(self) -> list[float]:
        return [b[0] - a[0] for a, b in itertools.pairwise(self.chunks)]


def side_figures(runs: list[Timeline], wall: float) -> dict[str, Any]:
    """TTFT and inter-token times (ms), tokens/s over the wall time of a whole level."""
    tokens = sum(r.tokens for r in runs)
    return {"requests": len(runs), "completion_tokens": tokens, "wall_s": round(wall, 3),
            "load_avg_1m_after": round(os.getloadavg()[0], 1),
            "tokens_per_s": round(tokens / wall, 1) if wall else float("nan"),
            "ttft_ms": summary([r.ttft for r in runs], 1000),
            "itl_ms": summary([g for r in runs for g in r.gaps()], 1000)}


async def measured_level(concurrency: int, count: int, one: Any, cpu_pids: list[int],
                         think_s: float = 0.0) -> tuple[dict[str, Any], list[Timeline]]:
    """One level's figures, with how contended the machine was (``cpu_probe_ms``) and the CPU seconds that
    ``cpu_pids`` and their children spent per 1,000 completion tokens (less sensitive to contention)."""
    from tests.benchmarks.profiling import cpu_probe, tree_cpu

    probe, cpu = cpu_probe(), tree_cpu(cpu_pids)
    runs, wall = await closed_loop(concurrency, count, one, think_s)
    figures = side_figures(runs, wall)
    figures["think_s"] = think_s
    spent = tree_cpu(cpu_pids) - cpu
    figures.update(cpu_probe_ms=probe, cpu_s=round(spent, 2),
                   cpu_s_per_1k_tokens=round(1000 * spent / figures["completion_tokens"], 2)
                   if figures["completion_tokens"] else float("nan"))
    return figures, runs


async def closed_loop(concurrency: int, count: int, one: Any, think_s: float = 0.0) -> tuple[list[Timeline], float]:
    """``count`` requests, ``concurrency`` in flight; ``one(i)`` runs request i and returns its Timeline.
    Each lane pauses ``think_s`` after a reply (a person reading it); the wall time returned leaves the
    longest lane's pauses out."""
    indices = iter(range(count))
    runs: list[Timeline] = []
    pauses = [0] * concurrency

    async def lane(k: int) -> None:
        for i in indices:
            runs.append(await one(i))
            if think_s:
                await asyncio.sleep(think_s)
                pauses[k] += 1

    start = time.time()
    await asyncio.gather(*[lane(k) for k in range(concurrency)])
    return runs, time.time() - start - think_s * max(pauses)


# -- direct engine side --------------------------------------------------------------------------------------
async def engine_request(engine: Any, prompt: list[int], max_tokens: int, sampling: Any) -> Timeline:
    """One request straight into AsyncLLM (VllmEngine) in this process."""
    run = Timeline(time.time())
    async for out in engine.generate(uuid.uuid4().hex, prompt, max_tokens, 0, sampling):
        if out.token_ids:
            run.chunks.append((time.time(), len(out.token_ids)))
            run.tokens += len(out.token_ids)
        if out.finished:
            run.extra["finish_reason"] = out.finish_reason
            break
    run.done = time.time()
    return run


# -- a tap on chat.tokens ---------------------------------------------------------------------------------
def firsts(records: Sequence[tuple[float, int, Any]]) -> dict[str, tuple[float, Any]]:
    """A generation's first event of each type, with the time it arrived, from a ``TokenTap``'s records; a token
    record counts once it carries text (sealed, its text is in ``sealed`` until a reader opens it)."""
    first: dict[str, tuple[float, Any]] = {}
    for arrived, _, e in records:
        if isinstance(e, TokensAppended) and not (e.text or e.sealed):
            continue
        first.setdefault(type(e).__name__, (arrived, e))
    return first


class TokenTap:
    """Reads ``chat.tokens`` (and any other ``topics``) from the end; every event, with the time it arrived
    here, per generation; ``finished`` waits for the generation's ``GenerationFinished``."""

    def __init__(self, settings: Settings, topics: Sequence[str] = ()) -> None:
        self.topics = [Topics(settings.topic_prefix).tokens, *topics]
        # The broker answers a fetch at the first record, so the default wait costs the tap no arrival time; a
        # 5 ms wait had it ask 200 times a second, about 0.12 of a core of the broker's on the measured side.
        self.consumer = make_consumer(settings.kafka_bootstrap, group_id=None)
        self.events: dict[str, list[tuple[float, int, Any]]] = {}
        self.done: dict[str, asyncio.Event] = {}
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        await self.consumer.start()
        await assign_at_end(self.consumer, self.topics)
        self._task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        while True:
            batch = await self.consumer.getmany(timeout_ms=100)
            now = time.time()
            for records in batch.values():
                for r in records:
                    try:
                        e = decode_record(r)
                    except EventDecodeError:
                        continue
                    gid = getattr(e, "generation_id", "")
                    self.events.setdefault(gid, []).append((now, r.offset, e))
                    if isinstance(e, GenerationFinished):
                        self.done.setdefault(gid, asyncio.Event()).set()

    async def finished(self, gid: str, timeout: float) -> list[tuple[float, int, Any]]:
        await asyncio.wait_for(self.done.setdefault(gid, asyncio.Event()).wait(), timeout)
        return self.events[gid]

    async def stop(self) -> None:
        if self._task:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        await self.consumer.stop()
