"""The whole service for end-to-end tests: real workers (vLLM on the CPU), stages, two gateways,
started as separate processes by the same commands `parley up` uses, on a topic prefix of their own."""
from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from infra.config.settings import Settings
from infra.local.topology import ensure_topics


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Proc:
    name: str
    popen: subprocess.Popen[bytes]
    log: Path
    port: int | None = None

    def kill(self, sig: int = signal.SIGKILL) -> None:
        try:
            os.killpg(self.popen.pid, sig)
        except ProcessLookupError:
            pass
        try:
            self.popen.wait(timeout=30)
        except subprocess.TimeoutExpired:  # too slow to stop on a busy machine: don't leave it behind
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.popen.pid, signal.SIGKILL)
            self.popen.wait(timeout=30)

    def log_tail(self, lines: int = 40) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])


@dataclass
class Service:
    settings: Settings
    env: dict[str, str]
    log_dir: Path
    procs: dict[str, Proc] = field(default_factory=dict)
    metrics_ports: dict[str, int] = field(default_factory=dict)  # process -> its /metrics port

    def start(self, name: str, *args: str, port: int | None = None) -> Proc:
        log = self.log_dir / f"{name}.log"
        popen = subprocess.Popen([sys.executable, "-m", "infra.local.cli", *args], env=self.env,
                                 stdout=log.open("wb"), stderr=subprocess.STDOUT, start_new_session=True)
        proc = self.procs[name] = Proc(name, popen, log, port)
        return proc

    def wait_log(self, proc: Proc, needle: str, timeout: float) -> None:
        deadline = time.time() + timeout
        while time.time() < deadline:
            if needle in proc.log.read_text(errors="replace"):
                return
            if proc.popen.poll() is not None:
                raise RuntimeError(f"{proc.name} exited: {proc.log_tail()}")
            time.sleep(0.5)
        raise TimeoutError(f"{proc.name} not ready in {timeout:.0f}s: {proc.log_tail()}")

    def start_gateway(self, name: str) -> Proc:
        port = free_port()
        proc = self.start(name, "gateway", "--port", str(port), port=port)
        deadline = time.time() + 90
        while time.time() < deadline:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=2).status_code == 200:
                    return proc
            except httpx.HTTPError:
                pass
            if proc.popen.poll() is not None:
                raise RuntimeError(f"{name} exited: {proc.log_tail()}")
            time.sleep(0.3)
        raise TimeoutError(f"{name} not ready: {proc.log_tail()}")

    def url(self, gateway: str = "gateway-a") -> str:
        return f"http://127.0.0.1:{self.procs[gateway].port}"

    def stop(self) -> None:
        for proc in reversed(list(self.procs.values())):
            if proc.popen.poll() is None:
                try:
                    proc.kill(signal.SIGTERM)
                except subprocess.TimeoutExpired:
                    proc.kill(signal.SIGKILL)  # never leave a worker behind
        if self.settings.topic_prefix:  # the launch's own topics: a broker full of old ones runs out of heap
            from topics.admin import delete_prefixed_async

            try:
                with ThreadPoolExecutor(1) as pool:  # stop() may be called from inside a running event loop
                    pool.submit(asyncio.run, delete_prefixed_async(self.settings.kafka_bootstrap,
                                                                   self.settings.topic_prefix)).result(60)
            except Exception as exc:  # noqa: BLE001 - a broker already gone has nothing left to clean
                print(f"e2e service: could not delete topics {self.settings.topic_prefix}*: {exc}")


def launch(base: Settings, log_dir: Path, reader_timeout_s: float = 3.0, plans_file: Path | None = None,
           pools: tuple[str, ...] = ("large", "small"), **env_overrides: str) -> Service:
    """Workers for ``pools`` (a pool left out has a queue that nothing drains), the stages and two gateways."""
    prefix = f"e2e{uuid.uuid4().hex[:8]}."
    extra = {"PARLEY_PLANS_FILE": str(plans_file)} if plans_file else {}
    # Metrics on ports of this launch's own: the fixed defaults may belong to a service `parley up` runs.
    metrics = {"stages": free_port(), **{f"worker-{p}": free_port() for p in pools}}
    ports = {f"PARLEY_POOL_{p.upper()}_METRICS_PORT": str(metrics[f"worker-{p}"]) for p in pools}
    # Engines sized to fit beside a running `parley up` on 24 GiB: vLLM's CPU build allocates its whole KV
    # cache at start, and 0.5 GiB (~23,000 SmolLM2 tokens) is plenty for 8 test sequences.
    env = dict(os.environ, **extra, **ports, PARLEY_TOPIC_PREFIX=prefix, PARLEY_KEYSPACE=base.keyspace,
               PARLEY_READER_TIMEOUT_S=str(reader_timeout_s), PARLEY_POOL_LARGE_MAX_SEQS="8",
               PARLEY_POOL_SMALL_MAX_SEQS="4", PARLEY_POOL_LARGE_KV_CACHE_GIB="0.5",
               PARLEY_POOL_SMALL_KV_CACHE_GIB="0.5", PARLEY_STAGES_METRICS_PORT=str(metrics["stages"]),
               PARLEY_KEY_CACHE_S="2", PARLEY_PURGE_DELAY_S="3",
               PARLEY_LOG_FORMAT="json", PYTHONUNBUFFERED="1")
    env.update(env_overrides)
    log_dir = log_dir / prefix.rstrip(".")  # one folder per launch: parallel runs never read each other's logs
    log_dir.mkdir(parents=True, exist_ok=True)
    service = Service(base.with_(topic_prefix=prefix), env, log_dir, metrics_ports=metrics)
    ensure_topics(service.settings)
    try:
        workers = [service.start(f"worker-{p}", "worker", "--pool", p) for p in pools]
        stages = service.start("stages", "stages")
        for gw in ("gateway-a", "gateway-b"):
            service.metrics_ports[gw] = service.start_gateway(gw).port or 0
        service.wait_log(stages, "stages ready", 180)
        for w in workers:
            service.wait_log(w, "worker ready", 400)
    except BaseException:
        service.stop()
        raise
    return service
