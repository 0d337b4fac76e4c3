"""One fault at a time against a private copy of the whole service, with replies streaming; after each,
the invariant checker (``invariants.py``). Each test prints the client's longest stall, the time to
recovery and the checker's counts. Heavy: run under the heavy lock (`flock /tmp/parley-heavy.lock`)."""
from __future__ import annotations

import asyncio
import contextlib
import inspect
import os
import signal
import time
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from infra.local.services import process
from tests.faults.client import chat, new_conversation
from tests.faults.invariants import Counts, Send, check
from tests.faults.private_stack import PrivateStack

pytestmark = pytest.mark.faults
QUESTION = "Write three sentences about the sea, then three about mountains."
RESULTS: list[str] = []
ARTIFACTS = Path(__file__).resolve().parents[1] / "artifacts"


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrivateStack]:
    private = PrivateStack.create(Path(tmp_path_factory.mktemp("faults")))
    try:
        private.up()
        yield private
    finally:
        print("\n".join(private.log_summary()))  # what each process complained of, for a failed run
        private.down()
        print("\n".join(RESULTS))
        ARTIFACTS.mkdir(parents=True, exist_ok=True)  # the figures, kept where a passing run leaves them
        (ARTIFACTS / "faults.txt").write_text("\n".join(RESULTS) + "\n")


@pytest.fixture
def user(stack: PrivateStack) -> tuple[str, str]:
    """A new paid account per fault: the checker audits whole (user, day)s, so one fault's problem is
    reported by that fault's test alone."""
    out = stack.parley("user", "create", "--plan", "paid").stdout
    fields = dict(line.split(":", 1) for line in out.splitlines() if ":" in line)
    return fields["user_id"].strip(), fields["token"].strip()


@pytest.fixture
async def stores(stack: PrivateStack) -> AsyncIterator[tuple[object, object]]:
    import redis.asyncio as aioredis

    from infra.stores.session import AsyncSession, connect

    cluster, session = connect(stack.settings)
    redis = aioredis.Redis.from_url(stack.settings.redis_url)
    yield AsyncSession(session), redis
    await redis.aclose()
    cluster.shutdown()


async def _with_fault(stack: PrivateStack, user: tuple[str, str], name: str, inject, replies: int = 2,  # type: ignore[no-untyped-def]
                      notes: list[str] | None = None) -> Counts:
    """Start ``replies`` sends, inject the fault once they stream, wait for every client, then check.
    ``inject`` may take the list of sends in progress (to read their generation ids); what it appends to
    ``notes`` is reported with the checker's counts."""
    since = datetime.now(UTC) - timedelta(minutes=1)
    user_id, token = user
    convs = [await new_conversation(stack.url, token) for _ in range(replies)]
    seen: list[Send] = []
    clients = [asyncio.create_task(chat(stack.url, token, user_id, c, QUESTION, seen=seen)) for c in convs]
    await _streaming(seen, clients, replies)
    began = time.monotonic()
    await (inject(seen) if inspect.signature(inject).parameters else inject())
    sends = await asyncio.wait_for(asyncio.gather(*clients), 300)
    recovered_s = time.monotonic() - began
    return await _checked(stack, name, sends, since, recovered_s, notes or [])


async def _streaming(seen: list[Send], clients: list[asyncio.Task[Send]], replies: int,
                     timeout_s: float = 120) -> None:
    """Until every send has streamed a delta (a fixed wait let a fault land before a loaded machine had
    accepted the sends, which then failed as never accepted)."""
    deadline = time.monotonic() + timeout_s
    while len(seen) < replies or not all(s.deltas or s.ended for s in seen):
        for c in clients:
            if c.done():
                c.result()  # a client that failed outright says why now
        assert time.monotonic() < deadline, f"replies not streaming after {timeout_s:.0f} s: {seen}"
        await asyncio.sleep(0.1)


async def _checked(stack: PrivateStack, name: str, sends, since: datetime, recovered_s: float,  # type: ignore[no-untyped-def]
                   notes: list[str] | None = None) -> Counts:
    import redis.asyncio as aioredis

    from infra.stores.session import AsyncSession, connect

    counts = None
    for _ in range(30):  # persistence and settlement catch up after the fault
        cluster, session = connect(stack.settings)
        redis = aioredis.Redis.from_url(stack.settings.redis_url)
        try:
            counts = await check(sends, settings=stack.settings, db=AsyncSession(session), redis=redis, since=since)
        finally:
            await redis.aclose()
            cluster.shutdown()
        if not counts.problems:
            break
        await asyncio.sleep(2)
    assert counts is not None
    RESULTS.append(f"{name}: longest client stall {counts.longest_stall_s:.1f} s, recovered in {recovered_s:.1f} s, "
                   f"{counts.accepted}/{counts.sends} accepted, {counts.saved_final} saved final, "
                   f"{counts.text_equal} text equal, {counts.deltas} deltas, {counts.running_left} running, "
                   f"{counts.reserved_left} reserved, billing {counts.billing_checked} checked / "
                   f"{counts.billing_mismatches} mismatches, recovering events "
                   f"{sum(s.recovering for s in sends)}" + "".join(f"; {n}" for n in notes or []))
    print(RESULTS[-1])
    assert counts.problems == [], counts.problems
    assert counts.accepted == counts.sends
    return counts


async def test_worker_sigkill_is_restarted_and_its_replies_resume(stack: PrivateStack, user: tuple[str, str]) -> None:
    before = stack.restarts("worker-small")

    async def kill() -> None:
        os.kill(stack.child_pid("worker-small"), signal.SIGKILL)

    await _with_fault(stack, user, "worker SIGKILL", kill)
    assert stack.restarts("worker-small") == before + 1


async def test_stages_sigkill_is_restarted_and_nothing_is_lost(stack: PrivateStack, user: tuple[str, str]) -> None:
    before = stack.restarts("stages")

    async def kill() -> None:
        os.kill(stack.child_pid("stages"), signal.SIGKILL)

    await _with_fault(stack, user, "stages SIGKILL", kill)
    assert stack.restarts("stages") == before + 1


async def test_redis_sigkill_and_restart(stack: PrivateStack, user: tuple[str, str]) -> None:
    async def kill_and_restart() -> None:
        os.kill(stack.pid("redis"), signal.SIGKILL)
        await asyncio.sleep(3)
        await asyncio.to_thread(stack.up, "--backbone-only")  # `up` restarts what died

    await _with_fault(stack, user, "Redis SIGKILL + restart", kill_and_restart)


async def test_cassandra_sigstop_60s(stack: PrivateStack, user: tuple[str, str]) -> None:
    async def pause() -> None:
        pid = stack.pid("cassandra")
        os.kill(pid, signal.SIGSTOP)
        try:
            await asyncio.sleep(60)
        finally:
            os.kill(pid, signal.SIGCONT)

    await _with_fault(stack, user, "Cassandra SIGSTOP 60 s", pause)


async def test_gateway_sigkill_clients_resume(stack: PrivateStack, user: tuple[str, str]) -> None:
    async def kill() -> None:
        os.kill(stack.child_pid("gateway"), signal.SIGKILL)

    await _with_fault(stack, user, "gateway SIGKILL", kill)


# ------------------------------------------------------------------ the broker, the store, fencing


async def _leader_of(stack: PrivateStack, topic: str, key: str) -> int:
    """The node id leading the partition ``key`` goes to (aiokafka's default partitioner: murmur2)."""
    from aiokafka.admin import AIOKafkaAdminClient
    from aiokafka.partitioner import murmur2

    admin = AIOKafkaAdminClient(bootstrap_servers=stack.settings.kafka_bootstrap)
    await admin.start()
    try:
        (described,) = await admin.describe_topics([topic])
    finally:
        await admin.close()
    partitions = sorted(described["partitions"], key=lambda p: p["partition"])
    chosen = (murmur2(key.encode()) & 0x7FFFFFFF) % len(partitions)
    return int(partitions[chosen]["leader"])


class AckedRecords:
    """Sequence-numbered records written with acks=all by an idempotent producer while a broker dies, then
    read back: every record the broker acknowledged must be there, once."""

    TOPIC = "faults.acked"

    def __init__(self, stack: PrivateStack) -> None:
        self.stack = stack
        self.acked: list[int] = []
        self.failed = 0
        self.longest_s = 0.0
        self._stop = asyncio.Event()

    async def create(self) -> None:
        from aiokafka.admin import AIOKafkaAdminClient, NewTopic

        s = self.stack.settings
        admin = AIOKafkaAdminClient(bootstrap_servers=s.kafka_bootstrap)
        await admin.start()
        try:
            if self.TOPIC not in await admin.list_topics():
                await admin.create_topics([NewTopic(self.TOPIC, 3, s.kafka_replication,
                                                    topic_configs={"min.insync.replicas": str(s.kafka_min_insync)})])
        finally:
            await admin.close()

    async def write(self) -> None:
        from topics.clients import make_producer

        producer = make_producer(self.stack.settings.kafka_bootstrap, request_timeout_ms=30_000)
        await producer.start()
        try:
            i = 0
            while not self._stop.is_set():
                began = time.monotonic()
                try:
                    await producer.send_and_wait(self.TOPIC, str(i).encode(), partition=i % 3)
                    self.acked.append(i)
                except Exception:  # noqa: BLE001 - not acknowledged: not owed
                    self.failed += 1
                self.longest_s = max(self.longest_s, time.monotonic() - began)
                i += 1
                await asyncio.sleep(0.02)
        finally:
            await producer.stop()

    def stop(self) -> None:
        self._stop.set()

    async def read_back(self) -> list[int]:
        from aiokafka import TopicPartition

        from topics.clients import make_consumer

        consumer = make_consumer(self.stack.settings.kafka_bootstrap, group_id=None)
        await consumer.start()
        try:
            parts = [TopicPartition(self.TOPIC, p) for p in range(3)]
            consumer.assign(parts)
            await consumer.seek_to_beginning(*parts)
            ends = await consumer.end_offsets(parts)
            values: list[int] = []
            while [tp for tp in parts if await consumer.position(tp) < ends[tp]]:
                batch = await consumer.getmany(timeout_ms=1000)
                values += [int(r.value) for records in batch.values() for r in records]
            return values
        finally:
            await consumer.stop()


async def test_kafka_broker_sigkill_loses_no_acknowledged_record(stack: PrivateStack, user: tuple[str, str]) -> None:
    """One of three brokers dies (SIGKILL) mid-reply: the broker leading the first reply's token partition."""
    assert stack.settings.kafka_brokers == 3
    acked = AckedRecords(stack)
    await acked.create()
    writer = asyncio.create_task(acked.write())
    notes: list[str] = []

    async def kill_a_leader(seen: list[Send]) -> None:
        node = await _leader_of(stack, stack.settings.topic_prefix + "chat.tokens", seen[0].generation_id)
        name = stack.kafka_nodes()[node - 1]
        os.kill(stack.pid(name), signal.SIGKILL)
        notes.append(f"killed {name} (node {node}, leader of the first reply's token partition)")

    try:
        await _with_fault(stack, user, "Kafka broker SIGKILL (1 of 3)", kill_a_leader, notes=notes)
        await asyncio.sleep(2)
    finally:
        acked.stop()
        await writer
        await asyncio.to_thread(stack.up, "--backbone-only")  # the killed broker rejoins for the tests after
    values = await acked.read_back()
    lost = sorted(set(acked.acked) - set(values))
    repeated = len(values) - len(set(values))
    line = (f"  acknowledged records: {len(acked.acked)} acked, {acked.failed} not acked, {len(lost)} lost, "
            f"{repeated} written twice, longest produce wait {acked.longest_s:.1f} s")
    RESULTS.append(line)
    print(line)
    assert acked.acked and not lost and repeated == 0


async def test_kafka_stop_and_start(stack: PrivateStack, user: tuple[str, str]) -> None:
    """Every broker stopped (SIGTERM) for 20 s, then `parley up`: streams pause, then complete."""
    async def stop_and_start() -> None:
        pids = [stack.pid(name) for name in stack.kafka_nodes()]
        assert all(process.is_alive(pid) for pid in pids), "a broker was already down before the fault"
        began = time.monotonic()
        for pid in pids:
            os.kill(pid, signal.SIGTERM)
        while any(process.is_alive(pid) for pid in pids) and time.monotonic() - began < 60:
            await asyncio.sleep(0.5)
        await asyncio.sleep(max(0.0, 20 - (time.monotonic() - began)))
        await asyncio.to_thread(stack.up, "--backbone-only")

    await _with_fault(stack, user, "Kafka stopped 20 s + restart (all 3 brokers)", stop_and_start)


async def test_cassandra_sigterm_and_restart(stack: PrivateStack, user: tuple[str, str]) -> None:
    """Cassandra stopped with SIGTERM while replies stream, then `parley up`: nothing saved is lost, every
    finished reply is saved final and charged once."""
    async def stop_and_start() -> None:
        pid = stack.pid("cassandra")
        os.kill(pid, signal.SIGTERM)
        began = time.monotonic()
        while process.is_alive(pid) and time.monotonic() - began < 90:
            await asyncio.sleep(0.5)
        await asyncio.to_thread(stack.up, "--backbone-only")

    await _with_fault(stack, user, "Cassandra SIGTERM + restart", stop_and_start)


async def test_worker_sigstop_sigcont_is_fenced(stack: PrivateStack, user: tuple[str, str]) -> None:
    """The worker is paused (SIGSTOP) mid-reply; a second worker of the pool joins, is given its partitions
    and takes the replies over; then the first is let go on (SIGCONT) while they still stream. It must not
    append to a generation it no longer owns: the clients see no repeated or interleaved tokens."""
    import subprocess
    import sys

    paused = stack.child_pid("worker-small")
    log_file = stack.state_dir / "logs" / "worker-small.log"
    log_from = log_file.stat().st_size
    second_log = stack.state_dir / "logs" / "worker-small-second.log"
    second: subprocess.Popen[bytes] | None = None
    notes: list[str] = []

    async def pause_then_resume() -> None:
        nonlocal second
        os.kill(paused, signal.SIGSTOP)
        with second_log.open("wb") as out:
            second = subprocess.Popen([sys.executable, "-m", "infra.local.cli", "worker", "--pool", "small",
                                       "--metrics-port", "0"], env=stack.env, stdout=out, stderr=subprocess.STDOUT,
                                      start_new_session=True)
        began = time.monotonic()
        while b"worker ready" not in second_log.read_bytes():
            assert second.poll() is None, second_log.read_text()[-3000:]
            assert time.monotonic() - began < 240, "the second worker did not start"
            await asyncio.sleep(0.5)
        await asyncio.sleep(1)  # it joins the group and takes the paused worker's partitions
        os.kill(paused, signal.SIGCONT)
        notes.append(f"paused {time.monotonic() - began:.1f} s")

    try:
        await _with_fault(stack, user, "worker SIGSTOP, taken over, SIGCONT", pause_then_resume, replies=2,
                          notes=notes)
        await asyncio.sleep(3)  # the woken worker meets its fence
        fenced = log_file.read_bytes()[log_from:].count(b"fenced off")
        RESULTS.append(f"  the woken worker stopped {fenced} generation(s) at its fence")
        print(RESULTS[-1])
    finally:
        if second is not None:
            os.killpg(second.pid, signal.SIGTERM)
            try:
                second.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(second.pid, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError):
            os.kill(paused, signal.SIGCONT)
