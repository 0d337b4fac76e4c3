"""The stage loop's ordering and commit rules, with an in-memory producer and consumer (the real loop runs
against Kafka in the integration and end-to-end tests)."""
from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from aiokafka import TopicPartition

from consumers.stage import Out, Stage
from infra.config.settings import Settings
from schemas import CancelRequested, encode
from topics import Role
from topics.catalogue import ADMISSION, CONTROL


@dataclass
class Record:
    key: bytes
    value: bytes
    offset: int
    topic: str = "t"
    partition: int = 0
    timestamp: int = 0


class FakeProducer:
    def __init__(self) -> None:
        self.sent: list[tuple[str, bytes]] = []
        self.unacked: list[asyncio.Future[None]] = []

    async def send(self, topic: str, value: bytes, key: bytes, partition: int | None = None) -> asyncio.Future[None]:
        self.sent.append((topic, key))
        ack: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.unacked.append(ack)
        return ack


class FakeConsumer:
    def __init__(self, producer: FakeProducer) -> None:
        self.producer, self.commits = producer, []  # type: ignore[var-annotated]

    def assignment(self) -> set[TopicPartition]:
        return {TopicPartition("t", 0)}

    async def commit(self, offsets: dict[TopicPartition, int]) -> None:
        assert all(a.done() for a in self.producer.unacked), "committed before every output was acknowledged"
        self.commits.append(offsets)


def cancel(gid: str) -> bytes:
    return encode(CancelRequested(generation_id=gid, conversation_id="c", user_id="u"))


async def run_partition(per_key: bool) -> tuple[list[str], FakeConsumer]:
    log: list[str] = []

    async def handler(event: Any) -> list[Out]:
        log.append(f"start {event.generation_id}")
        await asyncio.sleep(0.01 if event.generation_id.endswith("1") else 0.001)
        log.append(f"end {event.generation_id}")
        return [Out("out", event, event.generation_id)]

    stage = Stage(Role(ADMISSION, reads=(CONTROL,), writes=()), Settings(), (CancelRequested,), handler,
                  per_key=per_key)
    producer = FakeProducer()
    stage.producer, stage.consumer = producer, FakeConsumer(producer)  # type: ignore[assignment]
    records = [Record(b"a", cancel("a1"), 10), Record(b"b", cancel("b1"), 11), Record(b"a", cancel("a2"), 12)]

    async def ack_later() -> None:
        while len(producer.unacked) < 3:
            await asyncio.sleep(0.001)
        for ack in producer.unacked:
            ack.set_result(None)

    acker = asyncio.create_task(ack_later())
    await stage._partition(TopicPartition("t", 0), records)  # noqa: SLF001
    await acker
    assert not stage.consumer.commits  # type: ignore[attr-defined]  # with the next commit, not per batch
    await stage._commit(now=True)  # noqa: SLF001
    return log, stage.consumer  # type: ignore[return-value]


async def test_per_key_handles_keys_concurrently_but_each_key_in_order() -> None:
    log, consumer = await run_partition(per_key=True)
    assert log.index("end a1") < log.index("start a2")  # one key, in order
    assert log.index("start b1") < log.index("end a1")  # another key did not wait for it
    assert consumer.commits == [{TopicPartition("t", 0): 13}]  # once, past the last record, after the acks


async def test_default_handles_a_partition_strictly_in_order() -> None:
    log, consumer = await run_partition(per_key=False)
    assert log == ["start a1", "end a1", "start b1", "end b1", "start a2", "end a2"]
    assert consumer.commits == [{TopicPartition("t", 0): 13}]


async def test_a_change_of_assigned_partitions_is_told_before_their_records_are_handled() -> None:
    told: list[set[TopicPartition]] = []
    handled: list[str] = []

    async def handler(event: Any) -> list[Out]:
        handled.append(event.generation_id)
        return []

    stage = Stage(Role(ADMISSION, reads=(CONTROL,), writes=()), Settings(), (CancelRequested,), handler,
                  on_moved=lambda: (told.append(set(consumer.assigned)), handled.append("moved")))
    producer = FakeProducer()

    class Moving(FakeConsumer):
        def __init__(self) -> None:
            super().__init__(producer)
            self.assigned: set[TopicPartition] = set()
            self.batches: list[tuple[set[TopicPartition], dict[TopicPartition, list[Record]]]] = []

        def assignment(self) -> set[TopicPartition]:
            return set(self.assigned)

        async def getmany(self, timeout_ms: int, max_records: int) -> dict[TopicPartition, list[Record]]:
            self.assigned, batch = self.batches.pop(0)  # the rebalance lands while it fetches
            return batch

    consumer = Moving()
    stage.producer, stage.consumer = producer, consumer  # type: ignore[assignment]
    p0, p1 = TopicPartition("t", 0), TopicPartition("t", 1)
    consumer.batches = [({p0}, {p0: [Record(b"a", cancel("a1"), 1)]}),
                        ({p0}, {p0: [Record(b"a", cancel("a2"), 2)]}),
                        ({p0, p1}, {p1: [Record(b"b", cancel("b1"), 7, partition=1)]}),
                        ({p1}, {})]
    for _ in range(4):
        await stage.step()
    assert told == [{p0}, {p0, p1}, {p1}]  # once per change, none while it stays
    assert handled == ["moved", "a1", "a2", "moved", "b1", "moved"]  # told before the new partition's records


async def test_offsets_are_committed_at_most_every_half_second_and_as_the_stage_stops() -> None:
    async def handler(event: Any) -> list[Out]:
        return []

    stage = Stage(Role(ADMISSION, reads=(CONTROL,), writes=()), Settings(), (CancelRequested,), handler)
    producer, tp = FakeProducer(), TopicPartition("t", 0)

    class Feeding(FakeConsumer):
        def __init__(self) -> None:
            super().__init__(producer)
            self.batches = [{tp: [Record(b"a", cancel("a1"), 5)]}, {tp: [Record(b"b", cancel("b1"), 6)]},
                            {tp: [Record(b"c", cancel("c1"), 7)]}]

        async def getmany(self, timeout_ms: int, max_records: int) -> dict[TopicPartition, list[Record]]:
            if not self.batches:
                stage.stop()
                return {}
            return self.batches.pop(0)

    consumer = Feeding()
    stage.producer, stage.consumer = producer, consumer  # type: ignore[assignment]
    await stage.step()
    await stage.step()
    assert consumer.commits == [{tp: 6}]  # the first at once; the second waits for the half second
    await stage._loop()  # noqa: SLF001 - the third batch, then stopped: what was handled is committed
    assert consumer.commits == [{tp: 6}, {tp: 8}]
