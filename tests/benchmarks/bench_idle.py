"""What an idle service costs the Kafka broker: the requests Parley's own processes send it each second with
nothing in flight (their fetches' long polls, group heartbeats, the stages' lag telemetry), and the broker's CPU
with those processes running beside the same broker with them paused (SIGSTOP; resumed before it returns).

Run against the service ``infra/parley up`` started, with nothing else running:

    python -m tests.benchmarks.bench_idle [--seconds 60]

The requests are counted as the segments carrying data the broker receives on each Parley process's
connections (``ss -ti``'s ``data_segs_in``; an idle client's request fits one). A paused process's group
sessions lapse (6-10 s); its groups rebalance when it resumes.
"""
from __future__ import annotations

import argparse
import collections
import os
import re
import signal
import subprocess
import time

import psutil

from infra.config.settings import Settings
from tests.benchmarks.cpu_split import backbone_pids
from tests.benchmarks.profiling import cpu_seconds

SETTLE_S = 15.0  # after a pause: the paused members' sessions have lapsed and the broker is quiet


def parley_pids(settings: Settings) -> dict[str, int]:
    out = {}
    for path in sorted((settings.state_dir / "run").glob("*.pid")):
        name = path.stem
        if name in ("kafka", "cassandra", "redis") or name.endswith("supervisor"):
            continue
        try:
            pid = int(path.read_text().split()[0])
            os.kill(pid, 0)
        except (OSError, ValueError, IndexError):
            continue
        out[name] = pid
    return out


def _segments_in(broker_port: int) -> dict[int, int]:
    """Client port -> segments the broker has received on that connection."""
    lines = subprocess.run(["ss", "-tinH", "state", "established"], capture_output=True, text=True,
                           check=True).stdout.splitlines()
    out: dict[int, int] = {}
    for head, info in zip(lines, lines[1:], strict=False):
        fields = head.split()
        if len(fields) < 4 or not fields[2].endswith(f":{broker_port}"):
            continue
        if (m := re.search(r"data_segs_in:(\d+)", info)) is not None:
            out[int(fields[3].rsplit(":", 1)[1])] = int(m.group(1))
    return out


def _client_ports(broker_port: int, pids: dict[str, int]) -> dict[int, str]:
    lines = subprocess.run(["ss", "-tnpH", "state", "established"], capture_output=True, text=True,
                           check=True).stdout.splitlines()
    by_pid = {p.pid: name for name, pid in pids.items()
              for p in [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]}
    out = {}
    for line in lines:
        fields = line.split()
        if len(fields) < 4 or not fields[3].endswith(f":{broker_port}"):
            continue
        if (m := re.search(r"pid=(\d+)", line)) is not None and int(m.group(1)) in by_pid:
            out[int(fields[2].rsplit(":", 1)[1])] = by_pid[int(m.group(1))]
    return out


def requests_per_s(broker_port: int, pids: dict[str, int], seconds: float) -> dict[str, float]:
    before = _segments_in(broker_port)
    time.sleep(seconds)
    after = _segments_in(broker_port)
    owners = _client_ports(broker_port, pids)
    per: collections.Counter[str] = collections.Counter()
    for port, name in owners.items():
        if port in before and port in after:
            per[name] += (after[port] - before[port]) / seconds
    return dict(per)


def broker_cores(pid: int, seconds: float) -> float:
    start = cpu_seconds(pid)
    time.sleep(seconds)
    return (cpu_seconds(pid) - start) / seconds


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=60.0)
    ns = ap.parse_args()
    settings = Settings.from_env()
    broker = backbone_pids(settings)["kafka"]
    port = int(settings.kafka_bootstrap.rsplit(":", 1)[1])
    pids = parley_pids(settings)
    print(f"Parley's processes: {', '.join(sorted(pids))}; broker pid {broker}; {ns.seconds:.0f} s windows")
    asked = requests_per_s(port, pids, ns.seconds)
    for name, rate in sorted(asked.items(), key=lambda kv: -kv[1]):
        print(f"  {name:14} {rate:6.1f} requests/s to the broker")
    print(f"  {'all':14} {sum(asked.values()):6.1f} requests/s")
    running = broker_cores(broker, ns.seconds)
    # Each supervisor's child, the Python process that holds the Kafka clients (not an engine under it).
    stopped = [p.pid for pid in pids.values() for p in psutil.Process(pid).children(recursive=False)]
    for pid in stopped:
        os.kill(pid, signal.SIGSTOP)
    try:
        time.sleep(SETTLE_S)
        paused = broker_cores(broker, ns.seconds)
    finally:
        for pid in stopped:
            os.kill(pid, signal.SIGCONT)
    print(f"broker CPU, cores: Parley running {running:.3f}, paused {paused:.3f}; "
          f"Parley's idle clients cost it {running - paused:+.3f}")


if __name__ == "__main__":
    main()
