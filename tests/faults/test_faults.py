"""One fault at a time against a private copy of the whole service, with replies streaming; after each,
the invariant checker (``invariants.py``). Each test asserts that every send was still streaming when its
fault struck, that each reply ended as the fault allows (``complete`` or ``length``: none failed or stopped),
and that the fault's own effect happened (a restart by a supervisor, a hand-over, a fence); it prints the
client's longest stall, the time to recovery and the checker's counts. Heavy: run under the heavy lock
(`flock /tmp/parley-heavy.lock`)."""
from __future__ import annotations

import asyncio
import contextlib
import inspect
import os
import re
import signal
import subprocess
import time
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from infra.local.services import process
from tests.faults.client import chat, new_conversation
from tests.faults.invariants import EXPECTED, Counts, Send, check
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
                      notes: list[str] | None = None, expect: frozenset[str] = EXPECTED) -> tuple[Counts, list[Send]]:
    """Start ``replies`` sends, inject the fault once they stream, wait for every client, then check. ``inject``
    may take the list of sends in progress (to read their generation ids); what it appends to ``notes`` is
    reported with the checker's counts. Every send must still be streaming when the fault strikes (one that
    had ended would pass without living through it)."""
    since = datetime.now(UTC) - timedelta(minutes=1)
    user_id, token = user
    for attempt in range(3):  # a loaded machine may finish one reply before the other has begun: start again
        convs = [await new_conversation(stack.url, token) for _ in range(replies)]
        seen: list[Send] = []
        clients = [asyncio.create_task(chat(stack.url, token, user_id, c, QUESTION, seen=seen)) for c in convs]
        await _streaming(seen, clients, len(convs))
        live = sum(not s.ended for s in seen)
        if live == len(convs) or attempt == 2:
            break
        await asyncio.wait_for(asyncio.gather(*clients), 300)  # no fault yet: these are plain replies
    began = time.monotonic()
    await (inject(seen) if inspect.signature(inject).parameters else inject())
    sends = await asyncio.wait_for(asyncio.gather(*clients), 300)
    recovered_s = time.monotonic() - began
    notes = [f"{live}/{len(convs)} streaming when it struck", *(notes or [])]
    counts = await _checked(stack, name, sends, since, recovered_s, notes, expect)
    assert live == len(convs), f"{len(convs) - live} send(s) had ended before the fault struck"
    return counts, sends


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
                   notes: list[str] | None = None, expect: frozenset[str] = EXPECTED) -> Counts:
    import redis.asyncio as aioredis
    from cassandra.cluster import NoHostAvailable

    from infra.stores.session import AsyncSession, connect

    counts = None
    for attempt in range(30):  # persistence and settlement catch up after the fault
        try:
            cluster, session = connect(stack.settings)
        except NoHostAvailable:  # a Cassandra just back may answer CQL before it answers quickly
            assert attempt < 29, "Cassandra unreachable after the fault"
            await asyncio.sleep(2)
            continue
        redis = aioredis.Redis.from_url(stack.settings.redis_url)
        try:
            counts = await check(sends, settings=stack.settings, db=AsyncSession(session), redis=redis, since=since,
                                 expect=expect)
        finally:
            await redis.aclose()
            cluster.shutdown()
        if not counts.problems:
            break
        await asyncio.sleep(2)
    assert counts is not None
    RESULTS.append(f"{name}: longest client stall {counts.longest_stall_s:.1f} s, recovered in {recovered_s:.1f} s, "
                   f"{counts.accepted}/{counts.sends} accepted, {counts.saved_final} saved final, "
                   f"{counts.text_equal} text equal, {counts.snapshots} from a snapshot, {counts.deltas} deltas, "
                   f"{counts.running_left} running, {counts.reserved_left} reserved, billing "
                   f"{counts.billing_checked} checked / {counts.billing_mismatches} mismatches, recovering events "
                   f"{sum(s.recovering for s in sends)} {sorted({r for s in sends for r in s.reasons})}"
                   + "".join(f"; {n}" for n in notes or []))
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


REDIS_BACK_S = 30.0  # its supervisor's first backoff (1 s) and Redis's start, with room for a loaded machine


def _redis_answers(stack: PrivateStack, old_pid: int) -> bool:
    import redis

    try:
        if stack.pid("redis") == old_pid:
            return False
        return bool(redis.Redis.from_url(stack.settings.redis_url, socket_timeout=1).ping())
    except (OSError, ValueError, redis.RedisError):
        return False


async def test_redis_sigkill_is_restarted_by_its_supervisor(stack: PrivateStack, user: tuple[str, str]) -> None:
    """Redis SIGKILLed mid-reply: its supervisor starts it again (no `parley up`), the replies complete, and a
    client told why its reply stalled is told Redis was unreachable, never that its worker was lost."""
    before = stack.restarts("redis")
    notes: list[str] = []

    async def kill() -> None:
        pid = stack.pid("redis")
        os.kill(pid, signal.SIGKILL)
        began = time.monotonic()
        while not await asyncio.to_thread(_redis_answers, stack, pid):
            assert time.monotonic() - began < REDIS_BACK_S, f"Redis not back {REDIS_BACK_S:.0f} s after SIGKILL"
            await asyncio.sleep(0.2)
        notes.append(f"Redis answered again {time.monotonic() - began:.1f} s after SIGKILL")

    _, sends = await _with_fault(stack, user, "Redis SIGKILL, restarted by its supervisor", kill, notes=notes)
    assert stack.restarts("redis") == before + 1
    assert not [r for s in sends for r in s.reasons if r == "worker_lost"], [s.reasons for s in sends]


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

    restarts: dict[str, int] = {}

    async def kill_a_leader(seen: list[Send]) -> None:
        node = await _leader_of(stack, stack.settings.topic_prefix + "chat.tokens", seen[0].generation_id)
        name = stack.kafka_nodes()[node - 1]
        restarts[name] = stack.restarts(name)
        os.kill(stack.pid(name), signal.SIGKILL)
        notes.append(f"killed {name} (node {node}, leader of the first reply's token partition)")

    try:
        await _with_fault(stack, user, "Kafka broker SIGKILL (1 of 3)", kill_a_leader, notes=notes)
        await asyncio.sleep(2)
    finally:
        acked.stop()
        await writer
        await asyncio.to_thread(stack.up, "--backbone-only")  # waits until its supervisor has it answering
    assert {name: stack.restarts(name) for name in restarts} == {name: n + 1 for name, n in restarts.items()}
    values = await acked.read_back()
    lost = sorted(set(acked.acked) - set(values))
    repeated = len(values) - len(set(values))
    line = (f"  acknowledged records: {len(acked.acked)} acked, {acked.failed} not acked, {len(lost)} lost, "
            f"{repeated} written twice, longest produce wait {acked.longest_s:.1f} s")
    RESULTS.append(line)
    print(line)
    assert acked.acked and not lost and repeated == 0


async def test_kafka_stop_and_start(stack: PrivateStack, user: tuple[str, str]) -> None:
    """Every broker stopped (SIGTERM) for 20 s, its supervisor held (SIGSTOP) meanwhile, then let go: each
    supervisor starts its broker again; streams pause, say Kafka is unreachable (not that their worker was
    lost: it still beats in Redis), then complete."""
    names = stack.kafka_nodes()
    before = {name: stack.restarts(name) for name in names}

    async def stop_and_start() -> None:
        pids = [stack.pid(name) for name in names]
        supervisors = [stack.supervisor_pid(name) for name in names]
        assert all(process.is_alive(pid) for pid in pids), "a broker was already down before the fault"
        began = time.monotonic()
        for supervisor in supervisors:
            os.kill(supervisor, signal.SIGSTOP)
        try:
            for pid in pids:
                os.kill(pid, signal.SIGTERM)
            while any(process.is_alive(pid) for pid in pids) and time.monotonic() - began < 60:
                await asyncio.sleep(0.5)
            await asyncio.sleep(max(0.0, 20 - (time.monotonic() - began)))
        finally:
            for supervisor in supervisors:
                os.kill(supervisor, signal.SIGCONT)

    _, sends = await _with_fault(stack, user, "Kafka stopped 20 s, restarted by its supervisors (all 3 brokers)",
                                 stop_and_start)
    assert {name: stack.restarts(name) for name in names} == {name: n + 1 for name, n in before.items()}
    reasons = [s.reasons for s in sends]
    assert all("store_unavailable:Kafka" in r for r in reasons), reasons
    assert not [r for s in sends for r in s.reasons if r == "worker_lost"], reasons


async def test_cassandra_sigterm_and_restart(stack: PrivateStack, user: tuple[str, str]) -> None:
    """Cassandra stopped with SIGTERM while replies stream; its supervisor starts it again: nothing saved is
    lost, every finished reply is saved final and charged once."""
    before = stack.restarts("cassandra")

    async def stop() -> None:
        pid = stack.pid("cassandra")
        os.kill(pid, signal.SIGTERM)
        began = time.monotonic()
        while process.is_alive(pid) and time.monotonic() - began < 90:
            await asyncio.sleep(0.5)
        # `up` starts nothing here: it waits until the process the supervisor started answers CQL (the
        # checker reads Cassandra back; the replies themselves finish without it).
        await asyncio.to_thread(stack.up, "--backbone-only")

    await _with_fault(stack, user, "Cassandra SIGTERM, restarted by its supervisor", stop)
    assert stack.restarts("cassandra") == before + 1


async def _taken_over(stack: PrivateStack, sends: list[Send], timeout_s: float = 120) -> float:
    """Until every send's generation has a second owner (its epoch in Redis is 2 or more); the seconds it took."""
    import redis.asyncio as aioredis

    from infra.stores import keys

    began, client = time.monotonic(), aioredis.Redis.from_url(stack.settings.redis_url)
    try:
        while True:
            epochs = [int(await client.get(keys.generation_epoch(s.generation_id)) or 0) for s in sends]
            if all(e >= 2 for e in epochs):
                return time.monotonic() - began
            assert time.monotonic() - began < timeout_s, f"not taken over after {timeout_s:.0f} s: epochs {epochs}"
            await asyncio.sleep(0.2)
    finally:
        await client.aclose()


async def _log_says(path: Path, since: int, needle: bytes, count: int = 1, timeout_s: float = 30) -> int:
    """How often ``needle`` is in the log past ``since``, once it is there ``count`` times or ``timeout_s`` passed."""
    deadline = time.monotonic() + timeout_s
    while (found := path.read_bytes()[since:].count(needle)) < count and time.monotonic() < deadline:
        await asyncio.sleep(0.5)
    return found


async def _ready(log: Path, since: int, proc: subprocess.Popen[bytes] | None = None, timeout_s: float = 240) -> float:
    began = time.monotonic()
    while b"worker ready" not in log.read_bytes()[since:]:
        assert proc is None or proc.poll() is None, log.read_text()[-3000:]
        assert time.monotonic() - began < timeout_s, f"{log.name}: no worker ready after {timeout_s:.0f} s"
        await asyncio.sleep(0.5)
    return time.monotonic() - began


def _stop(proc: subprocess.Popen[bytes] | None) -> None:
    """A worker started here and everything left in its process group: a SIGKILLed worker's vLLM engine outlives
    it (reparented to init, 2 GB held for good) unless its group is killed too."""
    if proc is None:
        return
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(30)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)


async def _woken_worker_stopped(path: Path, since: int, timeout_s: float = 30) -> tuple[int, int]:
    """How many replies a worker woken by SIGCONT stopped at its fence, and how many it let go of because its
    partitions were revoked, once it has done either. Which comes first is a race on waking: the engine's next
    output (a long gap, so the fence is read) or the heartbeat that finds the worker out of the group (the
    rebalance cancels its replies). Both stop it before it appends."""
    deadline = time.monotonic() + timeout_s
    while True:
        text = path.read_bytes()[since:]
        fenced = text.count(b"fenced off")
        let_go = sum(int(n) for n in re.findall(rb"let go of (\d+) generation", text))
        if fenced + let_go or time.monotonic() > deadline:
            return fenced, let_go
        await asyncio.sleep(0.5)


@pytest.mark.timeout(900)  # a second worker's start on a loaded machine
async def test_worker_sigstop_sigcont_is_fenced(stack: PrivateStack, user: tuple[str, str]) -> None:
    """The worker is paused (SIGSTOP) mid-reply; a second worker of the pool joins, is given its partitions
    and takes the replies over; then the first is let go on (SIGCONT) while its engine still holds them. It
    must not append to a generation it no longer owns: it meets its fence (or, when the heartbeat that finds it
    out of the group wins the race, lets its replies go in the rebalance), and the clients see no repeated or
    interleaved tokens."""
    paused = stack.child_pid("worker-small")
    log_file = stack.state_dir / "logs" / "worker-small.log"
    log_from = log_file.stat().st_size
    second_log = stack.state_dir / "logs" / "worker-small-second.log"
    second: subprocess.Popen[bytes] | None = None
    notes: list[str] = []

    async def pause_then_resume(seen: list[Send]) -> None:
        nonlocal second
        os.kill(paused, signal.SIGSTOP)
        began = time.monotonic()
        second = stack.second_worker(second_log)
        await _ready(second_log, 0, second)
        took = await _taken_over(stack, seen)  # the second worker took every generation under a newer epoch
        os.kill(paused, signal.SIGCONT)
        notes.append(f"paused {time.monotonic() - began:.1f} s, taken over {took:.1f} s after the second was ready")

    try:
        await _with_fault(stack, user, "worker SIGSTOP, taken over, SIGCONT", pause_then_resume, replies=2,
                          notes=notes)
        fenced, let_go = await _woken_worker_stopped(log_file, log_from)
        RESULTS.append(f"  the woken worker stopped {fenced} generation(s) at its fence, let go of {let_go}")
        print(RESULTS[-1])
        assert fenced + let_go >= 1, "the woken worker neither met its fence nor let its replies go"
    finally:
        _stop(second)
        with contextlib.suppress(ProcessLookupError):
            os.kill(paused, signal.SIGCONT)


# ------------------------------------------------------------------ hand-over to a second replica


def _paid_partitions(log: Path, since: int) -> set[int] | None:
    """The ``generate.small.paid`` partitions of a worker's latest assignment logged past ``since``."""
    lines = [line for line in log.read_bytes()[since:].decode(errors="replace").splitlines() if " assigned [" in line]
    return {int(n) for n in re.findall(r"generate\.small\.paid\[(\d+)\]", lines[-1])} if lines else None


async def _settled(logs: list[Path], since: list[int], partitions: int = 4, timeout_s: float = 90) -> list[set[int]]:
    """Until the workers' latest assignments split the paid lane's partitions between them, each holding some."""
    deadline = time.monotonic() + timeout_s
    while True:
        held = [_paid_partitions(log, at) for log, at in zip(logs, since, strict=True)]
        if all(held) and set().union(*held) == set(range(partitions)) and sum(map(len, held)) == partitions:  # type: ignore[arg-type]
            return held  # type: ignore[return-value]
        assert time.monotonic() < deadline, f"the group did not settle: {held}"
        await asyncio.sleep(0.5)


def _placed(stages_log: Path, generation_id: str) -> int:
    """The paid-lane partition the scheduler put a generation on (its log line, ids only)."""
    found = re.search(rf"generation {re.escape(generation_id)} -> generate\.small\.paid\[(\d+)\]",
                      stages_log.read_text(errors="replace"))
    assert found, f"the scheduler's log does not place {generation_id}"
    return int(found.group(1))


@pytest.mark.timeout(900)  # a second worker's start on a loaded machine
async def test_worker_sigkill_hands_its_replies_to_the_other_replica(stack: PrivateStack,
                                                                      user: tuple[str, str]) -> None:
    """Two workers serve the pool in one consumer group. The one holding the first reply is SIGKILLed
    mid-reply: the group's session timeout notices, the rebalance gives its partitions to the other, which
    resumes each of its replies from the saved tokens (one prefill). The killed worker's restart is held
    (its supervisor stopped) until the replies are done, so only the other replica can have resumed them.
    Every reply completes exactly; the longest client stall is printed."""
    logs = [stack.state_dir / "logs" / "worker-small.log", stack.state_dir / "logs" / "worker-small-handover.log"]
    since = [logs[0].stat().st_size, 0]
    second: subprocess.Popen[bytes] | None = None
    notes: list[str] = []
    fault: dict[str, object] = {}  # what the kill chose: the victim (0 the supervised worker, 1 the second) ...

    async def kill_the_first_replys_worker(seen: list[Send]) -> None:
        stages = stack.state_dir / "logs" / "stages.log"
        where = [_placed(stages, s.generation_id) for s in seen]
        victim = next(i for i, parts in enumerate(held) if where[0] in parts)
        fault.update(victim=victim, log_at=logs[victim].stat().st_size,
                     moved=[s.generation_id for s, part in zip(seen, where, strict=True) if part in held[victim]])
        if victim == 0:
            os.kill(stack.pid("worker-small"), signal.SIGSTOP)  # its supervisor: no restart until we say
        os.kill(stack.child_pid("worker-small") if victim == 0 else second.pid, signal.SIGKILL)  # type: ignore[union-attr]
        notes.append(f"killed {logs[victim].stem} holding {len(fault['moved'])} of {len(seen)} replies")  # type: ignore[arg-type]

    try:
        second = stack.second_worker(logs[1])
        await _ready(logs[1], 0, second)
        held = await _settled(logs, since)
        _, sends = await _with_fault(stack, user, "worker SIGKILL with a second replica",  # 2: the plan's max_running
                                     kill_the_first_replys_worker, notes=notes)
        moved, survivor = fault["moved"], 1 - int(fault["victim"])  # type: ignore[call-overload]
        resumed = [g for g in moved if await _log_says(logs[survivor], since[survivor],  # type: ignore[attr-defined]
                                                       f"generation {g} resumed at seq".encode(), timeout_s=5)]
        stall = max(s.longest_gap_s for s in sends if s.generation_id in moved)  # type: ignore[operator]
        line = (f"  hand-over: {len(resumed)}/{len(moved)} replies of the killed worker resumed on "  # type: ignore[arg-type]
                f"{logs[survivor].stem}, their longest client stall {stall:.1f} s")
        RESULTS.append(line)
        print(line)
        assert moved and resumed == moved
    finally:
        _stop(second)
        if fault.get("victim") == 0:
            os.kill(stack.pid("worker-small"), signal.SIGCONT)
            await _ready(logs[0], int(fault["log_at"]))  # type: ignore[call-overload]  # the tests after need it


@pytest.mark.timeout(900)  # a second engine's start on a loaded machine
async def test_worker_sigkill_with_no_replica_left_is_stood_in_for_by_a_compatible_pool(
        stack: PrivateStack, user: tuple[str, str]) -> None:
    """The pool's only worker is SIGKILLed mid-reply and its restart held (its supervisor stopped). A worker of
    pool `spare`, which `small` declares compatible (the same model), stands in: once small's announcement has
    expired it joins small's consumer group, is given its partitions when the dead member is evicted, and
    resumes every reply from its saved tokens, instead of the replies waiting for the restart and the engine's
    load. When small's worker is back, the stand-in hands the pool back."""
    own, spare_log = stack.state_dir / "logs" / "worker-small.log", stack.state_dir / "logs" / "worker-spare.log"
    spare: subprocess.Popen[bytes] | None = None
    fault: dict[str, object] = {}

    async def kill_the_only_replica(seen: list[Send]) -> None:
        fault.update(log_at=own.stat().st_size, moved=[s.generation_id for s in seen])
        os.kill(stack.pid("worker-small"), signal.SIGSTOP)  # its supervisor: no restart until we say
        os.kill(stack.child_pid("worker-small"), signal.SIGKILL)

    handed_back = 0
    try:
        spare = stack.compatible_worker(spare_log)
        await _ready(spare_log, 0, spare)
        await asyncio.sleep(3)  # its watch has read small's announcement (it reads once a second)
        _, sends = await _with_fault(stack, user, "worker SIGKILL with no replica left, a compatible pool stands in",
                                     kill_the_only_replica)
        moved = fault["moved"]
        assert await _log_says(spare_log, 0, b"stands in", timeout_s=5) == 1
        resumed = [g for g in moved if await _log_says(spare_log, 0,  # type: ignore[attr-defined]
                                                       f"generation {g} resumed at seq".encode(), timeout_s=5)]
        stall = max(s.longest_gap_s for s in sends)
        line = (f"  stand-in: {len(resumed)}/{len(moved)} replies of the killed worker resumed by the "  # type: ignore[arg-type]
                f"compatible pool's worker, their longest client stall {stall:.1f} s")
        RESULTS.append(line)
        print(line)
        assert moved and resumed == moved
    finally:
        if "log_at" in fault:
            os.kill(stack.pid("worker-small"), signal.SIGCONT)
            await _ready(own, int(fault["log_at"]))  # type: ignore[call-overload]  # the tests after need it
            handed_back = await _log_says(spare_log, 0, b"its stand-in stops", timeout_s=60)
        _stop(spare)
    assert handed_back == 1, "the stand-in did not hand small back once its worker was ready"
