"""A private Parley for ``parley loadtest --scenario``: sim-engine workers, the stages and a gateway, started as
separate processes by the same commands `parley up` uses, on the shared backbone (Kafka, Cassandra, Redis of
`parley up`) with a topic prefix and a keyspace of their own, and stopped (topics deleted) afterwards.

The pools file and plans file it runs on are written beside its logs under ``bench-results/loadtest/<prefix>/``:
every pool ``engine = "sim"``; plans with the seeds' reply cap (2,000) and limits high enough that a load of many
users is never refused for quota, while each plan's queue-wait limit (overflow, Retry-After) stays as shipped.
"""
from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import tomllib
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from infra.config.settings import CONFIG_DIR, Settings, env_var

KEYSPACE = "parley_loadtest"
QUOTA = {"daily_tokens": 10**10, "bucket_tokens_per_minute": 10**10, "bucket_burst": 10**10, "max_running": 10**6,
         "reply_cap": 2000}
READY_S = {"stages": 240.0, "worker": 240.0, "gateway": 120.0}


@dataclass(frozen=True)
class SimPool:
    """One pool of sim workers: how many, how big a batch, and its ``[pools.<name>.sim]`` values."""

    workers: int = 1
    max_num_seqs: int = 183
    sim: dict[str, Any] = field(default_factory=dict)
    flush_ms: float | None = None  # the pool's token flush window (None: the shipped default)
    flush_on_time: bool | None = None  # flushed by the worker's clock too (None: the shipped default)
    flush_together: bool | None = None  # the clock flushes every reply at once (None: the shipped default)
    routing: str | None = None  # how the scheduler picks among its workers (None: the shipped default)
    stream_interval: int | None = None  # the engine hands over a reply's tokens this often (None: shipped)
    flush_drain: bool | None = None  # each reply's loop takes its outputs at its flush tick (None: shipped)
    flush_groups: int | None = None  # the flush clock's groups, one a tick (None: shipped)


@dataclass(frozen=True)
class ServiceSpec:
    pools: dict[str, SimPool]
    gateways: int = 1


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return f'"{value}"' if isinstance(value, str) else repr(value)


def pools_toml(spec: ServiceSpec) -> str:
    """The pools file: the shipped defaults, every pool on the sim engine with room for the seeds' prompts."""
    lines = ["[defaults]", 'engine = "sim"', "max_model_len = 8192", "max_num_batched_tokens = 8192",
             "metrics_port = 0", ""]
    for name, pool in spec.pools.items():
        # its own model name per pool, so a reply shows which pool answered (overflow to small)
        lines += [f"[pools.{name}]", f"max_num_seqs = {pool.max_num_seqs}", f'served_model_name = "sim-{name}"',
                  f'description = "loadtest sim {name}"',
                  *([f"flush_ms = {pool.flush_ms!r}"] if pool.flush_ms is not None else []),
                  *([f"flush_on_time = {_toml_value(pool.flush_on_time)}"] if pool.flush_on_time is not None
                    else []),
                  *([f"flush_together = {_toml_value(pool.flush_together)}"] if pool.flush_together is not None
                    else []),
                  *([f'routing = "{pool.routing}"'] if pool.routing is not None else []),
                  *([f"stream_interval = {pool.stream_interval}"] if pool.stream_interval is not None else []),
                  *([f"flush_drain = {_toml_value(pool.flush_drain)}"] if pool.flush_drain is not None else []),
                  *([f"flush_groups = {pool.flush_groups}"] if pool.flush_groups is not None else []), ""]
        if pool.sim:
            lines += [f"[pools.{name}.sim]", *(f"{k} = {_toml_value(v)}" for k, v in pool.sim.items()), ""]
    return "\n".join(lines)


def plans_toml() -> str:
    """The shipped plans with quota limits lifted and the seeds' reply cap."""
    plans = tomllib.loads((CONFIG_DIR / "plans.toml").read_text())["plans"]
    out = []
    for name, fields in plans.items():
        out.append(f"[plans.{name}]")
        out += [f"{k} = {_toml_value(QUOTA.get(k, v))}" for k, v in fields.items()]
        out.append("")
    return "\n".join(out)


@dataclass
class PrivateService:
    spec: ServiceSpec
    settings: Settings
    env: dict[str, str]
    log_dir: Path
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    metrics: dict[str, int] = field(default_factory=dict)  # process -> its /metrics port
    gateway_ports: list[int] = field(default_factory=list)

    def start(self, name: str, *args: str) -> subprocess.Popen[bytes]:
        log = (self.log_dir / f"{name}.log").open("wb")
        popen = subprocess.Popen([sys.executable, "-m", "infra.local.cli", *args], env=self.env, stdout=log,
                                 stderr=subprocess.STDOUT, start_new_session=True)
        self.procs[name] = popen
        return popen

    def wait_log(self, name: str, needle: str, timeout: float) -> None:
        log, deadline = self.log_dir / f"{name}.log", time.monotonic() + timeout
        while time.monotonic() < deadline:
            if needle in log.read_text(errors="replace"):
                return
            if self.procs[name].poll() is not None:
                raise RuntimeError(f"{name} exited; see {log}")
            time.sleep(0.5)
        raise TimeoutError(f"{name} not ready in {timeout:.0f} s; see {log}")

    def wait_http(self, name: str, port: int, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=2).status_code == 200:
                    return
            if self.procs[name].poll() is not None:
                raise RuntimeError(f"{name} exited; see {self.log_dir / name}.log")
            time.sleep(0.3)
        raise TimeoutError(f"{name} not ready in {timeout:.0f} s")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.gateway_ports[0]}"

    def workers(self) -> dict[str, str]:
        """pool -> the /metrics URL of its first worker."""
        return {pool: f"http://127.0.0.1:{self.metrics[f'worker-{pool}-0']}/metrics" for pool in self.spec.pools}

    def stop(self) -> None:
        """SIGTERM every process group (last started first), SIGKILL what is left after 30 s; drop the topics."""
        for popen in reversed(list(self.procs.values())):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(popen.pid, signal.SIGTERM)
        deadline = time.monotonic() + 30
        for popen in self.procs.values():
            try:
                popen.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(popen.pid, signal.SIGKILL)
                popen.wait(timeout=30)
        from topics.admin import delete_prefixed_async

        with contextlib.suppress(Exception):  # a broker already gone has nothing left to clean
            asyncio.run(delete_prefixed_async(self.settings.kafka_bootstrap, self.settings.topic_prefix))


def prepare(spec: ServiceSpec, root: Path, keyspace: str = KEYSPACE) -> PrivateService:
    """Settings, files and environment of a new private service (nothing started yet)."""
    prefix = f"lt{uuid.uuid4().hex[:8]}."
    log_dir = root / prefix.rstrip(".")
    log_dir.mkdir(parents=True, exist_ok=True)
    (log_dir / "pools.toml").write_text(pools_toml(spec))
    (log_dir / "plans.toml").write_text(plans_toml())
    base = Settings.from_env()
    settings = base.with_(topic_prefix=prefix, keyspace=keyspace, pools_file=log_dir / "pools.toml",
                          plans_file=log_dir / "plans.toml", log_format="json", pool_overrides=())
    # The private service's own settings, whole: nothing of the caller's (a pool override) leaks in.
    env = {k: v for k, v in os.environ.items() if not k.startswith(env_var(""))}
    env.update(settings.to_env(), PYTHONUNBUFFERED="1")
    return PrivateService(spec, settings, env, log_dir)


def launch(spec: ServiceSpec, root: Path, keyspace: str = KEYSPACE) -> PrivateService:
    """Migrate the keyspace, create the topics, start everything and wait until each process is ready."""
    from infra.local.topology import ensure_topics
    from infra.stores.cql.migrate import apply

    svc = prepare(spec, root, keyspace)
    apply(svc.settings)
    ensure_topics(svc.settings)
    try:
        svc.metrics["stages"] = free_port()
        svc.start("stages", "stages", "--metrics-port", str(svc.metrics["stages"]))
        for pool, p in spec.pools.items():
            for i in range(p.workers):
                name = f"worker-{pool}-{i}"
                svc.metrics[name] = free_port()
                svc.start(name, "worker", "--pool", pool, "--metrics-port", str(svc.metrics[name]))
        for i in range(spec.gateways):
            port = free_port()
            svc.start(f"gateway-{i}", "gateway", "--port", str(port))
            svc.gateway_ports.append(port)
            svc.wait_http(f"gateway-{i}", port, READY_S["gateway"])
        svc.wait_log("stages", "stages ready", READY_S["stages"])
        for name in svc.procs:
            if name.startswith("worker-"):
                svc.wait_log(name, "worker ready", READY_S["worker"])
    except BaseException:
        svc.stop()
        raise
    return svc
