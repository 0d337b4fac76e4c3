"""A private copy of the whole service for fault tests: its own Kafka, Cassandra and Redis on other ports,
its own state folder, started and stopped by the project's own `parley up` / `parley down`. Faults are
only ever injected here, never into the shared backbone (9092/9042/6379).

One worker pool (`small`) keeps the start-up bounded; every process runs under `parley supervise`, the
backbone included. A fault test that wants a second replica of the pool starts one (``second_worker``), and one
that wants a compatible pool starts a worker of pool `spare` (``compatible_worker``).
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from infra.config.settings import Settings
from infra.local.services import process

POOLS_TOML = """
[defaults]
model_dir = ""
served_model_name = "SmolLM2-135M-Instruct"
max_model_len = 2048
max_num_batched_tokens = 256
kv_cache_gib = 0.5  # two of these run at once in the SIGSTOP test, beside `parley up`'s service
enable_prefix_caching = true
scheduling_policy = "priority"
dtype = "bfloat16"

[pools.small]
max_num_seqs = 8
description = "the fault suite's only pool"
"""


def _below_ephemeral() -> tuple[int, int]:
    """Ports the kernel never hands out as a client's source port. A service port inside the ephemeral range
    can be taken while its service is down: a client reconnecting to 127.0.0.1:P may be given P as its own
    source port and connect to itself (TCP simultaneous open), and the restarted service then fails to bind
    (seen with a Kafka broker restarted after 40 s down)."""
    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    return 10_000, max(low, 12_000)


def free_run(n: int, tries: int = 500) -> int:
    """The first of ``n`` consecutive free ports below the ephemeral range (a 3-broker Kafka takes pairs
    two apart from its base)."""
    import random

    low, high = _below_ephemeral()
    for _ in range(tries):
        base = random.randrange(low, high - n)
        if all(process.port_free("127.0.0.1", base + i) for i in range(n)):
            return base
    raise RuntimeError(f"no {n} consecutive free ports found in {low}-{high}")


def free_ports(n: int) -> list[int]:
    """``n`` distinct free ports below the ephemeral range."""
    ports: list[int] = []
    while len(ports) < n:
        port = free_run(1)
        if port not in ports:
            ports.append(port)
    return ports


@dataclass
class PrivateStack:
    state_dir: Path
    env: dict[str, str]

    @classmethod
    def create(cls, root: Path, brokers: int = 3) -> PrivateStack:
        """Kafka as ``brokers`` KRaft brokers (3: replication 3, min.insync.replicas 2, so a broker can be
        killed mid-reply)."""
        cql, storage, jmx, redis, gateway, stages_metrics, worker_metrics = free_ports(7)
        kafka = free_run(2 * brokers)
        controller = kafka + 1
        # Metrics ports too: the service from `parley up` holds the fixed ones (9110-9112).
        (root / "pools.toml").write_text(POOLS_TOML + f"metrics_port = {worker_metrics}\n")
        env = {**os.environ, "PARLEY_STATE_DIR": str(root / "state"), "PARLEY_KAFKA_PORT": str(kafka),
               "PARLEY_KAFKA_CONTROLLER_PORT": str(controller), "PARLEY_CASSANDRA_PORT": str(cql),
               "PARLEY_CASSANDRA_STORAGE_PORT": str(storage), "PARLEY_CASSANDRA_JMX_PORT": str(jmx),
               "PARLEY_REDIS_PORT": str(redis), "PARLEY_GATEWAY_PORT": str(gateway),
               "PARLEY_STAGES_METRICS_PORT": str(stages_metrics),
               "PARLEY_KAFKA_BROKERS": str(brokers), "PARLEY_KAFKA_HEAP_MB": "256",
               "PARLEY_CASSANDRA_HEAP_MB": "512", "PARLEY_POOLS_FILE": str(root / "pools.toml"),
               "PARLEY_DEFAULT_POOL": "small", "PARLEY_KEYSPACE": "parley_faults", "PARLEY_TOPIC_PREFIX": "",
               "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
        return cls(root / "state", env)

    @property
    def settings(self) -> Settings:
        return Settings.from_env(self.env)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.env['PARLEY_GATEWAY_PORT']}"

    def parley(self, *args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "infra.local.cli", *args], env=self.env, text=True,
                              capture_output=True, timeout=timeout, check=False)

    def up(self, *flags: str) -> str:
        done = self.parley("up", *flags)
        if done.returncode != 0:
            raise RuntimeError(f"parley up failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
        return done.stdout

    def down(self) -> None:
        self.parley("down", "--timeout", "20", timeout=300)

    def log_summary(self, top: int = 6) -> list[str]:
        """Per service log: its most frequent warnings and errors (JSON lines; message texts are never logged)."""
        from collections import Counter

        lines = []
        for path in sorted((self.state_dir / "logs").glob("*.log")):
            counts: Counter[str] = Counter()
            with path.open(errors="replace") as fh:
                for line in fh:
                    try:
                        entry = json.loads(line)
                    except ValueError:
                        continue
                    if isinstance(entry, dict) and entry.get("level") in ("WARNING", "ERROR", "CRITICAL"):
                        counts[f"{entry['level']} {entry.get('logger')}: {str(entry.get('msg'))[:140]}"] += 1
            lines += [f"{path.stem}: {n} x {what}" for what, n in counts.most_common(top)]
        return lines

    def kafka_nodes(self) -> list[str]:
        return ["kafka", *(f"kafka-{n}" for n in range(2, self.settings.kafka_brokers + 1))]

    def pid(self, name: str) -> int:
        return int((self.state_dir / "run" / f"{name}.pid").read_text().split()[0])

    def supervisor_pid(self, name: str) -> int:
        """A backbone service's supervisor (Redis, Kafka, Cassandra: `parley supervise --pid-file`)."""
        return int((self.state_dir / "run" / f"{name}.supervisor.pid").read_text().split()[0])

    def child_pid(self, name: str) -> int:
        """The service process under its supervisor (what a crash kills)."""
        return int(json.loads((self.state_dir / "run" / f"{name}.restarts.json").read_text())["child_pid"])

    def second_worker(self, log_file: Path) -> subprocess.Popen[bytes]:
        """Another worker of the `small` pool, in the same consumer group, unsupervised (the test stops it)."""
        with log_file.open("wb") as out:
            return subprocess.Popen([sys.executable, "-m", "infra.local.cli", "worker", "--pool", "small",
                                     "--metrics-port", "0"], env=self.env, stdout=out, stderr=subprocess.STDOUT,
                                    start_new_session=True)

    def compatible_worker(self, log_file: Path) -> subprocess.Popen[bytes]:
        """A worker of pool `spare`, which `small` declares compatible (the same model), unsupervised (the test
        stops it): it stands in for `small` once no replica of small is left. Its pools file is its own, so `up`
        starts no spare worker; the spare pool's topics are made first."""
        path = self.state_dir.parent / "pools-spare.toml"
        path.write_text(POOLS_TOML + 'compatible = ["spare"]\n\n[pools.spare]\nmax_num_seqs = 8\n'
                        'description = "stands in for small"\n')
        env = {**self.env, "PARLEY_POOLS_FILE": str(path)}
        made = subprocess.run([sys.executable, "-m", "infra.local.cli", "topics"], env=env, text=True,
                              capture_output=True, timeout=120, check=False)
        assert made.returncode == 0, made.stdout[-2000:] + made.stderr[-2000:]
        with log_file.open("wb") as out:
            return subprocess.Popen([sys.executable, "-m", "infra.local.cli", "worker", "--pool", "spare",
                                     "--metrics-port", "0"], env=env, stdout=out, stderr=subprocess.STDOUT,
                                    start_new_session=True)

    def restarts(self, name: str) -> int:
        return int(json.loads((self.state_dir / "run" / f"{name}.restarts.json").read_text())["restarts"])

    def signal(self, pid: int, sig: signal.Signals) -> None:
        os.kill(pid, sig)

    def wait_ready(self, path: str = "/healthz", timeout: float = 180) -> float:
        import httpx

        began = time.monotonic()
        while time.monotonic() - began < timeout:
            try:
                if httpx.get(self.url + path, timeout=2).status_code == 200:
                    return time.monotonic() - began
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        raise TimeoutError(f"{path} did not answer within {timeout} s")
