"""What a lightweight transaction costs Cassandra under each Paxos variant, in one run, alternating.

Cassandra 5.0 runs conditional writes on Paxos v1 unless told otherwise: four round trips among the
partition's replicas, each a write or read of ``system.paxos``; v2 (since 4.1) needs two. The service makes one
or two a request: the usage ledger's conditional batch (``Records.count_usage``, every reply) and the
``client_message_id`` claim (``IF NOT EXISTS``). Against the Cassandra of ``parley up``, in a scratch keyspace
(dropped at the end), for each variant in turn (set live over JMX, ``PaxosVariant.java``), this runs the
ledger's own code and an ``IF NOT EXISTS`` on a new key, beside a plain insert as the yardstick: Cassandra's CPU
per statement (8 at once), and the latency of one at a time. Prints each figure and v2's ratio to v1, and leaves
the variant as it found it.

    python -m tests.benchmarks.bench_paxos [--count 600] [--rounds 3]
"""
from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path

from infra.config.settings import Settings
from infra.stores.records import Records
from infra.stores.session import AsyncSession, connect
from tests.benchmarks.profiling import cpu_seconds

KEYSPACE = "parley_bench_paxos"
HELPER = Path(__file__).with_name("PaxosVariant.java")
LEDGER_DDL = Path(__file__).resolve().parents[2] / "infra" / "stores" / "cql"
VARIANTS = ("v1", "v2")


def variant(port: int, value: str | None = None) -> str:
    """The live Paxos variant (set first when ``value`` is given), over Cassandra's local JMX port."""
    args = ["java", str(HELPER), str(port)] + ([value] if value else [])
    return subprocess.run(args, check=True, capture_output=True, text=True).stdout.strip()


def ledger_tables(session: object) -> None:
    """The ledger's table as the migrations make it, in the scratch keyspace."""
    for path in sorted(LEDGER_DDL.glob("*.cql")):
        text = "\n".join(line for line in path.read_text().splitlines() if not line.strip().startswith("--"))
        for statement in text.split(";"):
            if "usage_by_generation" in statement:
                session.execute(statement.strip())  # type: ignore[attr-defined]


async def timed(pid: int, work: Callable[[int], Awaitable[object]], count: int, at_once: int) -> tuple[float, float]:
    """(Cassandra CPU ms per statement with ``at_once`` in flight, mean ms per statement one at a time)."""
    gate = asyncio.Semaphore(at_once)

    async def one(i: int) -> None:
        async with gate:
            await work(i)

    await asyncio.gather(*(one(-i - 1) for i in range(20)))  # warm
    before = cpu_seconds(pid)
    await asyncio.gather(*(one(i) for i in range(count)))
    cpu_ms = (cpu_seconds(pid) - before) / count * 1000
    began = time.perf_counter()
    for i in range(count // 10):
        await work(count + i)
    return cpu_ms, (time.perf_counter() - began) / (count // 10) * 1000


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=600)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    settings = Settings.from_env()
    port = settings.ports.cassandra_jmx
    pid = int((settings.state_dir / "run" / "cassandra.pid").read_text().split()[0])  # parley up's
    found = variant(port)
    cluster, session = connect(settings, keyspace=None)
    session.execute(f"CREATE KEYSPACE IF NOT EXISTS {KEYSPACE} WITH replication = "
                    "{'class': 'SimpleStrategy', 'replication_factor': 1}")
    session.execute(f"CREATE TABLE IF NOT EXISTS {KEYSPACE}.claims (k text PRIMARY KEY, v int)")
    session.set_keyspace(KEYSPACE)
    ledger_tables(session)
    db = AsyncSession(session, KEYSPACE)
    day, users = time.strftime("%Y-%m-%d"), [uuid.uuid4().hex for _ in range(64)]
    records = Records(db)
    shapes: dict[str, Callable[[int], Awaitable[object]]] = {
        "plain insert": lambda i: db.execute("INSERT INTO claims (k, v) VALUES (?, ?)", (uuid.uuid4().hex, i)),
        "insert IF NOT EXISTS": lambda i: db.execute("INSERT INTO claims (k, v) VALUES (?, ?) IF NOT EXISTS",
                                                     (uuid.uuid4().hex, i)),
        # Each user's replies are counted one at a time (the rollup's lock): 64 users, so the 8 in flight rarely
        # share a partition and contend.
        "usage ledger (count_usage)": lambda i: records.count_usage(users[i % len(users)], day, uuid.uuid4().hex,
                                                                    100, 640, 0),
    }
    got: dict[tuple[str, str], list[tuple[float, float]]] = {}
    try:
        for _ in range(args.rounds):
            for v in VARIANTS:
                if variant(port, v) != v:
                    raise SystemExit(f"Cassandra did not take Paxos variant {v}")
                for name, work in shapes.items():
                    got.setdefault((name, v), []).append(await timed(pid, work, args.count, 8))
    finally:
        variant(port, found)
        session.execute(f"DROP KEYSPACE IF EXISTS {KEYSPACE}")
        cluster.shutdown()
    print(f"Cassandra per statement, median of {args.rounds} rounds of {args.count} (8 at once for CPU, "
          f"then {args.count // 10} one at a time); variant found: {found}")
    print(f"{'':30}{'CPU v1':>9}{'CPU v2':>9}{'v2/v1':>7}{'ms v1':>9}{'ms v2':>9}{'v2/v1':>7}")
    for name in shapes:
        cpu = [statistics.median(c for c, _ in got[(name, v)]) for v in VARIANTS]
        wall = [statistics.median(w for _, w in got[(name, v)]) for v in VARIANTS]
        print(f"{name:30}{cpu[0]:>9.3f}{cpu[1]:>9.3f}{cpu[1] / cpu[0]:>7.2f}"
              f"{wall[0]:>9.3f}{wall[1]:>9.3f}{wall[1] / wall[0]:>7.2f}")


if __name__ == "__main__":
    asyncio.run(main())
