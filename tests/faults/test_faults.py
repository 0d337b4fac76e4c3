"""One fault at a time against a private copy of the whole service, with replies streaming; after each,
the invariant checker (``invariants.py``). Each test prints the client's longest stall, the time to
recovery and the checker's counts. Heavy: run under the heavy lock (`flock /tmp/parley-heavy.lock`)."""
from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from tests.faults.client import chat, new_conversation
from tests.faults.invariants import Counts, check
from tests.faults.private_stack import PrivateStack

pytestmark = pytest.mark.faults
QUESTION = "Write three sentences about the sea, then three about mountains."
RESULTS: list[str] = []


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrivateStack]:
    private = PrivateStack.create(Path(tmp_path_factory.mktemp("faults")))
    try:
        private.up()
        yield private
    finally:
        private.down()
        print("\n".join(RESULTS))


@pytest.fixture(scope="module")
def user(stack: PrivateStack) -> tuple[str, str]:
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


async def _with_fault(stack: PrivateStack, user: tuple[str, str], name: str, inject, replies: int = 2) -> Counts:  # type: ignore[no-untyped-def]
    """Start ``replies`` sends, inject the fault once they stream, wait for every client, then check."""
    since = datetime.now(UTC) - timedelta(minutes=1)
    user_id, token = user
    convs = [await new_conversation(stack.url, token) for _ in range(replies)]
    clients = [asyncio.create_task(chat(stack.url, token, user_id, c, QUESTION)) for c in convs]
    await asyncio.sleep(1.5)  # replies are streaming
    began = time.monotonic()
    await inject()
    sends = await asyncio.wait_for(asyncio.gather(*clients), 300)
    recovered_s = time.monotonic() - began
    return await _checked(stack, name, sends, since, recovered_s)


async def _checked(stack: PrivateStack, name: str, sends, since: datetime, recovered_s: float) -> Counts:  # type: ignore[no-untyped-def]
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
                   f"{sum(s.recovering for s in sends)}")
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


async def test_cassandra_sigstop_20s(stack: PrivateStack, user: tuple[str, str]) -> None:
    async def pause() -> None:
        pid = stack.pid("cassandra")
        os.kill(pid, signal.SIGSTOP)
        try:
            await asyncio.sleep(20)
        finally:
            os.kill(pid, signal.SIGCONT)

    await _with_fault(stack, user, "Cassandra SIGSTOP 20 s", pause)


async def test_gateway_sigkill_clients_resume(stack: PrivateStack, user: tuple[str, str]) -> None:
    async def kill() -> None:
        os.kill(stack.child_pid("gateway"), signal.SIGKILL)

    await _with_fault(stack, user, "gateway SIGKILL", kill)
