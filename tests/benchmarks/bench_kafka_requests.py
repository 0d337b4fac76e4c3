"""The Kafka broker's requests per chat request, by kind and by the topics they name: which reader or writer
costs the broker what.

Turns on the broker's request log (``kafka.request.logger`` at DEBUG, over a JMX agent started in the broker of
``parley up`` with ``jcmd``; ``KafkaJmx.java``), plays ``parley loadtest --scenario replica`` for ``--duration``
seconds on a private sim service, turns the log back off, and counts the requests that name the private service's
topics or consumer groups (the idle service of ``parley up`` beside it is left out). Prints each (request kind,
topics) per chat request the load completed, the load generator's own tap apart, and the broker's own counters
(``RequestsPerSec``) over the same window as a check.

    python -m tests.benchmarks.bench_kafka_requests [--duration 20] [--jmx-port 9997] [--paid-share 0.5]
"""
from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

from infra.config.settings import Settings

HELPER = Path(__file__).with_name("KafkaJmx.java")
LOGGER = "kafka.request.logger"
TAP_TOPICS = {"chat.requests", "chat.tokens"}  # only the load generator's tap reads both


def jmx(port: int, *args: str) -> str:
    return subprocess.run(["java", str(HELPER), str(port), *args], check=True, capture_output=True,
                          text=True).stdout


def ensure_agent(pid: int, port: int) -> None:
    """A JMX agent in the broker on ``port`` (the broker runs without one; ``jcmd`` starts it in place)."""
    try:
        jmx(port, "counts")
    except subprocess.CalledProcessError:
        subprocess.run(["jcmd", str(pid), "ManagementAgent.start", f"jmxremote.port={port}",
                        "jmxremote.authenticate=false", "jmxremote.ssl=false", "jmxremote.host=127.0.0.1"],
                       check=True, capture_output=True)


def counts(port: int) -> Counter[str]:
    return Counter({k: int(v) for k, v in (line.split() for line in jmx(port, "counts").splitlines())})


def logged_since(path: Path, offset: int, since: float) -> str:
    """What the broker logged from ``offset`` on, also when its supervisor moved the log to ``<log>.1`` meanwhile
    (it keeps each log under 64 MiB, and the request log at DEBUG writes that in a minute)."""
    kept = path.with_name(path.name + ".1")
    parts = []
    if kept.exists() and kept.stat().st_mtime >= since:
        with kept.open("rb") as f:
            f.seek(offset)
            parts.append(f.read())
        offset = 0
    with path.open("rb") as f:
        f.seek(offset)
        parts.append(f.read())
    return b"".join(parts).decode(errors="replace")


def requests_in(log: str, prefix: str) -> Counter[tuple[str, str]]:
    """(kind, the topics it names without the prefix, or its group) -> completed requests of the private service."""
    out: Counter[tuple[str, str]] = Counter()
    for line in log.splitlines():
        at = line.find("Completed request:")
        if at < 0:
            continue
        try:
            done: dict[str, Any] = json.loads(line[at + len("Completed request:"):line.rfind(" (")])
        except ValueError:
            continue
        kind = (done.get("requestHeader") or {}).get("requestApiKeyName", "?")
        request = done.get("request") or {}
        listed = (request.get("topics") or []) + (request.get("topicData") or [])
        named = {t.get("topic") or t.get("name") or "" for t in listed if isinstance(t, dict)}
        groups = request.get("groups") or []
        group = request.get("groupId") or next((g.get("groupId") for g in groups if isinstance(g, dict)), None) or ""
        mine = {t.removeprefix(prefix) for t in named if t.startswith(prefix)}
        if mine:
            out[(kind, ",".join(sorted(mine)))] += 1
        elif group.startswith(prefix):
            out[(kind, f"group {group.removeprefix(prefix)}")] += 1
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=20.0)
    parser.add_argument("--jmx-port", type=int, default=9997)
    parser.add_argument("--paid-share", type=float, default=0.5,
                        help="share of paid users (a free reply's text is released a checked sentence at a time)")
    args = parser.parse_args()
    settings = Settings.from_env()
    pid = int((settings.state_dir / "run" / "kafka.pid").read_text().split()[0])
    log_path = settings.state_dir / "logs" / "kafka.log"
    ensure_agent(pid, args.jmx_port)
    summary = Path(tempfile.mkdtemp()) / "summary.json"
    before, start, began = counts(args.jmx_port), log_path.stat().st_size, time.time()
    jmx(args.jmx_port, "log", LOGGER, "DEBUG")
    try:
        played = subprocess.run([sys.executable, "-m", "infra.local.cli", "loadtest", "--scenario", "replica",
                                 "--duration", str(args.duration), "--paid-share", str(args.paid_share),
                                 "--summary", str(summary)],
                                capture_output=True, text=True, check=True)
    finally:
        jmx(args.jmx_port, "log", LOGGER, "WARN")  # as infra/local/kafka/log4j2.properties sets it
    after = counts(args.jmx_port)
    log = logged_since(log_path, start, began)
    prefix = re.search(r"private service (\w+) ready", played.stdout + played.stderr, re.IGNORECASE)
    if prefix is None:
        raise SystemExit("the load test named no private service")
    found = requests_in(log, prefix.group(1) + ".")
    done = sum(step["completed"] for step in json.loads(summary.read_text())["steps"])
    tap = {k: n for k, n in found.items() if k[0] == "FETCH" and TAP_TOPICS <= set(k[1].split(","))}
    service = {k: n for k, n in found.items() if k not in tap}
    print(f"{done} chat requests completed in {args.duration:g} s of arrivals; broker requests per chat request "
          f"(the private service's; the load generator's tap apart)")
    for kind in sorted({k for k, _ in service}):
        rows = sorted(((n, t) for (k, t), n in service.items() if k == kind), reverse=True)
        print(f"{kind:18}{sum(n for n, _ in rows) / done:8.1f}")
        for n, topics in rows[:6]:
            print(f"{'':4}{n / done:8.1f}  {topics[:100]}")
    print(f"{'all':18}{sum(service.values()) / done:8.1f}   tap: {sum(tap.values()) / done:.1f} fetches")
    grown = {k: after[k] - before[k] for k in ("Fetch", "Produce", "OffsetCommit", "Heartbeat")}
    print("broker counters over the window, both services and the tap: "
          + ", ".join(f"{k} {v}" for k, v in grown.items()))


if __name__ == "__main__":
    main()
