"""Store outages waited out in place, poison records dead-lettered, one stage's failure kept to itself:
the logic, with fakes for the stores and Kafka clients (the fault suite runs it against the real stack)."""
from __future__ import annotations

import asyncio
from typing import Any

import pytest
from aiokafka import TopicPartition
from cassandra.cluster import NoHostAvailable
from redis.exceptions import ConnectionError as RedisConnectionError

from consumers.stage import Out, Stage
from infra.config.settings import Settings
from infra.stores.retry import HEALTH, until_stored
from schemas import CancelRequested, EventDeadLettered, decode
from streams.reaper import Reaper
from tests.unit.test_stage import FakeConsumer, FakeProducer, Record, cancel
from topics import Role
from topics.catalogue import ADMISSION, CONTROL
from topics.runner import Runner, run_stages


class Flaky:
    """Fails with ``errors`` one after another, then answers."""

    def __init__(self, *errors: BaseException) -> None:
        self.errors, self.calls = list(errors), 0

    async def __call__(self, value: str) -> str:
        self.calls += 1
        if self.errors:
            raise self.errors.pop(0)
        return value.upper()


async def test_a_store_outage_is_waited_out_and_shown_in_health_meanwhile() -> None:
    call = Flaky(NoHostAvailable("down", {}), RedisConnectionError("refused"), NoHostAvailable("down", {}))
    seen: list[dict[str, Any]] = []
    HEALTH.listeners.append(seen.append)
    try:
        assert await until_stored("persistence", call, "saved", first_s=0.001, max_s=0.004) == "SAVED"
    finally:
        HEALTH.listeners.remove(seen.append)
    assert call.calls == 4
    assert [sorted((s, d) for s, (d, _) in w.items()) for w in seen] == [
        [("persistence", "Cassandra")], [("persistence", "Redis")], [("persistence", "Cassandra")], []]
    assert "persistence" not in HEALTH.waiting


async def test_other_errors_are_not_retried() -> None:
    with pytest.raises(ValueError):
        await until_stored("s", Flaky(ValueError("bug")), "x", first_s=0.001)


def _stage(handler: Any) -> tuple[Stage, FakeProducer]:
    stage = Stage(Role(ADMISSION, reads=(CONTROL,), writes=()), Settings(), (CancelRequested,), handler)
    producer = FakeProducer()
    stage.producer, stage.consumer = producer, FakeConsumer(producer)  # type: ignore[assignment]
    return stage, producer


async def test_a_stage_holds_its_record_through_an_outage_and_commits_after() -> None:
    outage = Flaky(NoHostAvailable("down", {}), NoHostAvailable("down", {}))

    async def handler(event: Any) -> list[Out]:
        await outage("x")
        return [Out("out", event, event.generation_id)]

    stage, producer = _stage(handler)
    task = asyncio.create_task(stage._partition(TopicPartition("t", 0), [Record(b"a", cancel("a1"), 7)]))  # noqa: SLF001
    while not producer.unacked:
        await asyncio.sleep(0.01)
    assert stage.consumer.commits == [] and outage.calls == 3  # type: ignore[attr-defined]
    producer.unacked[0].set_result(None)
    await task
    await stage._commit(now=True)  # noqa: SLF001
    assert producer.sent == [("out", b"a1")] and stage.consumer.commits == [{TopicPartition("t", 0): 8}]  # type: ignore[attr-defined]


async def test_a_poison_record_is_dead_lettered_with_its_error_and_the_next_one_handled(
        monkeypatch: pytest.MonkeyPatch) -> None:
    dead: list[EventDeadLettered] = []

    async def fake_send(producer: Any, topic: str, event: Any, key: str, partition: int | None = None) -> None:
        dead.append(event)

    monkeypatch.setattr("topics.clients.send", fake_send)

    async def handler(event: Any) -> list[Out]:
        if event.generation_id == "bad":
            raise KeyError("no such plan")
        return [Out("out", event, event.generation_id)]

    stage, producer = _stage(handler)
    acks = await stage._handle([Record(b"bad", cancel("bad"), 1), Record(b"ok", cancel("ok"), 2)])  # noqa: SLF001
    assert len(acks) == 1 and producer.sent == [("out", b"ok")]
    assert len(dead) == 1 and dead[0].offset == 1 and "KeyError" in dead[0].error
    assert decode(dead[0].raw.encode()).generation_id == "bad"  # type: ignore[attr-defined]


class Crashy(Runner):
    def __init__(self, name: str, crashes: int) -> None:
        super().__init__()
        self.name, self.crashes, self.runs, self.resets = name, crashes, 0, 0
        self.stopping_ = asyncio.Event()

    async def run(self) -> None:
        self.runs += 1
        if self.runs <= self.crashes:
            raise RuntimeError("boom")
        await self.stopping_.wait()

    def stop(self) -> None:
        self.stopping_.set()

    def reset(self) -> None:
        self.resets += 1


async def test_a_failing_stage_is_restarted_alone_and_the_others_keep_running() -> None:
    crashy, steady = Crashy("crashy", crashes=2), Crashy("steady", crashes=0)
    runner = asyncio.create_task(run_stages(crashy, steady, restart_s=0.01))
    while crashy.runs < 3:
        await asyncio.sleep(0.01)
    assert steady.runs == 1 and not steady.stopping_.is_set() and crashy.resets == 2
    crashy.stop()
    steady.stop()
    await asyncio.wait_for(runner, 5)


class DownQuota:
    def __init__(self, failures: int) -> None:
        self.failures, self.calls = failures, 0

    async def expired(self, now: float) -> list[str]:
        self.calls += 1
        if self.calls <= self.failures:
            raise RedisConnectionError("Connection refused")
        return []

    async def unpublished(self, grace_s: float, now: float) -> list[Any]:
        return []


class NullProducer:
    async def start(self) -> None: ...

    async def stop(self) -> None: ...


async def test_the_reaper_survives_a_redis_outage_and_sweeps_again() -> None:
    quota = DownQuota(failures=2)
    reaper = Reaper(Settings(), quota, interval_s=0.01)  # type: ignore[arg-type]
    reaper.producer = NullProducer()  # type: ignore[assignment]
    task = asyncio.create_task(reaper.run())
    while quota.calls < 4:
        await asyncio.sleep(0.01)
    assert not task.done() and "reaper" not in HEALTH.waiting
    reaper.stop()
    await asyncio.wait_for(task, 5)


class DyingBackground(Runner):
    """A stage whose background task raises on its first run only; its loop just idles."""

    def __init__(self) -> None:
        super().__init__()
        self.name, self.runs = "dying", 0

    def background(self) -> list[Any]:
        self.runs += 1
        return [self._fail()] if self.runs == 1 else []

    async def _fail(self) -> None:
        await asyncio.sleep(0.01)
        raise RedisConnectionError("Connection reset by peer")

    async def step(self) -> None:
        await self.idle(0.05)


async def test_a_stage_whose_background_task_dies_is_restarted_not_left_deaf() -> None:
    stage = DyingBackground()
    runner = asyncio.create_task(run_stages(stage, restart_s=0.01))
    while stage.runs < 2:
        await asyncio.sleep(0.01)
    assert not runner.done()  # restarted, and now running with its background work back
    stage.stop()
    await asyncio.wait_for(runner, 5)
