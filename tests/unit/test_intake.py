"""A worker's intake: the paid lane first, never more than its free slots, the free lane held while paid records
may be waiting unfetched, and offsets committed only past finished requests."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from aiokafka import TopicPartition
from aiokafka.errors import KafkaError

from consumers.generation.intake import Intake, paid_first, partition_prefix, request_key

PAID, FREE = "generate.large.paid", "generate.large.free"


@dataclass
class Rec:
    offset: int


class FakeConsumer:
    """The parts of AIOKafkaConsumer the intake uses: one partition per lane, records handed out per getmany."""

    def __init__(self, records: dict[TopicPartition, list[int]], highwater: dict[TopicPartition, int | None]):
        self.records, self.high = records, highwater
        self.position_of = {tp: 0 for tp in records}
        self.paused: set[TopicPartition] = set()
        self.calls: list[tuple[tuple[TopicPartition, ...], int, int]] = []
        self.committed: list[dict[Any, int]] = []
        self.fail_next: BaseException | None = None

    def assignment(self) -> set[TopicPartition]:
        return set(self.records)

    def pause(self, *tps: TopicPartition) -> None:
        self.paused |= set(tps)

    def resume(self, *tps: TopicPartition) -> None:
        self.paused -= set(tps)

    def highwater(self, tp: TopicPartition) -> int | None:
        return self.high[tp]

    async def position(self, tp: TopicPartition) -> int:
        return self.position_of[tp]

    async def getmany(self, *tps: TopicPartition, timeout_ms: int, max_records: int) -> dict[TopicPartition, list[Rec]]:
        self.calls.append((tps, timeout_ms, max_records))
        if self.fail_next is not None:
            exc, self.fail_next = self.fail_next, None
            raise exc
        out: dict[TopicPartition, list[Rec]] = {}
        for tp in tps:
            if tp in self.paused:
                continue
            take = self.records[tp][:max_records - sum(len(v) for v in out.values())]
            if take:
                out[tp] = [Rec(o) for o in take]
                self.records[tp] = self.records[tp][len(take):]
                self.position_of[tp] = take[-1] + 1
        return out

    async def commit(self, offsets: dict[Any, int]) -> None:
        self.committed.append(dict(offsets))


paid, free = TopicPartition(PAID, 0), TopicPartition(FREE, 0)


async def test_paid_records_come_first_and_never_more_than_the_slots() -> None:
    consumer = FakeConsumer({paid: [0, 1, 2], free: [0, 1]}, {paid: 3, free: 2})
    intake = Intake(consumer, PAID, FREE)
    assert [(tp.topic, r.offset) for tp, r in await intake.take(2)] == [(PAID, 0), (PAID, 1)]
    assert [(tp.topic, r.offset) for tp, r in await intake.take(5)] == [(PAID, 2)]  # a poll that found paid work
    assert [(tp.topic, r.offset) for tp, r in await intake.take(5)] == [(FREE, 0), (FREE, 1)]


async def test_the_free_lane_waits_while_paid_records_may_be_there_unfetched() -> None:
    # The paid partition's high watermark is past its position, but its records are not fetched yet.
    consumer = FakeConsumer({paid: [], free: [0]}, {paid: 4, free: 1})
    intake = Intake(consumer, PAID, FREE)
    assert await intake.take(4) == []
    assert free in consumer.paused
    assert all(free not in tps for tps, _, _ in consumer.calls)
    consumer.high[paid] = 0  # the paid lane is known empty now: both lanes are waited on at once
    taken = await intake.take(4)
    assert [(tp.topic, r.offset) for tp, r in taken] == [(FREE, 0)]
    assert consumer.calls[-1][0] == (paid, free)


async def test_an_unknown_paid_high_watermark_counts_as_waiting() -> None:
    consumer = FakeConsumer({paid: [], free: [0]}, {paid: None, free: 1})
    assert await Intake(consumer, PAID, FREE).take(4) == []


async def test_a_poll_a_rebalance_interrupts_takes_nothing_and_marks_nothing_started() -> None:
    consumer = FakeConsumer({paid: [0], free: []}, {paid: 1, free: 0})
    intake = Intake(consumer, PAID, FREE)
    consumer.fail_next = KafkaError()
    assert await intake.take(4) == []
    assert intake.tracker.in_flight() == 0


async def test_offsets_are_committed_only_past_finished_requests() -> None:
    consumer = FakeConsumer({paid: [0, 1, 2], free: []}, {paid: 3, free: 0})
    intake = Intake(consumer, PAID, FREE)
    await intake.take(3)
    intake.finished(paid, 1)
    intake.finished(paid, 2)
    await intake.commit()
    assert consumer.committed == [{paid: 0}]  # offset 0 still runs: a crash now re-reads it
    intake.finished(paid, 0)
    await intake.commit()
    assert consumer.committed[-1] == {paid: 3}
    await intake.commit()
    assert len(consumer.committed) == 2  # nothing moved: nothing sent


async def test_hold_pauses_every_assigned_partition_and_take_resumes_them() -> None:
    consumer = FakeConsumer({paid: [], free: []}, {paid: 0, free: 0})
    intake = Intake(consumer, PAID, FREE)
    intake.hold()
    assert consumer.paused == {paid, free}
    await intake.take(1)
    assert consumer.paused == set()


def test_paid_first_orders_lanes_then_partitions_and_keeps_offsets_in_order() -> None:
    got = {TopicPartition(FREE, 0): [Rec(5)], TopicPartition(PAID, 1): [Rec(1), Rec(2)],
           TopicPartition(PAID, 0): [Rec(9)]}
    assert [(tp.topic, tp.partition, r.offset) for tp, r in paid_first(got, PAID)] == [
        (PAID, 0, 9), (PAID, 1, 1), (PAID, 1, 2), (FREE, 0, 5)]


def test_a_request_key_starts_with_its_partitions_prefix_only() -> None:
    assert request_key(TopicPartition(PAID, 1), 7).startswith(partition_prefix(TopicPartition(PAID, 1)))
    assert not request_key(TopicPartition(PAID, 11), 7).startswith(partition_prefix(TopicPartition(PAID, 1)))
