"""Partition-affine delivery without a broker: which partitions a gateway owns, ids minted onto them, and the
borrowed tails of other gateways' partitions (one per partition, shared, closed after the last stream)."""
from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable
from typing import Any

import pytest

from producers.gateway import ownership, tails
from producers.gateway.relay import TokenRelay
from schemas import id_time_ms, new_id
from topics.partitioning import partition_for


def test_gateways_split_the_partitions_between_them_with_none_left_over_or_shared() -> None:
    for count in (1, 2, 3, 4, 6):
        shares = [ownership.owned(i, count, 6) for i in range(count)]
        assert sorted(p for share in shares for p in share) == list(range(6))
    assert ownership.owned(1, 4, 6) == {1, 5} and ownership.owned(3, 4, 6) == {3}


def test_a_gateway_that_would_own_nothing_is_refused_with_what_to_do() -> None:
    with pytest.raises(ownership.NoPartitions, match="at most 6 gateways"):
        ownership.owned(6, 7, 6)
    with pytest.raises(ValueError, match="0 or more"):
        ownership.owned(-1, 2, 6)
    with pytest.raises(ValueError, match="1 or more"):
        ownership.owned(0, 0, 6)


def test_an_index_past_the_count_shares_the_partitions_of_its_remainder() -> None:
    # a StatefulSet grown to 8 pods with 6 partition groups: pods 6 and 7 read what pods 0 and 1 read
    assert ownership.owned(6, 6, 6) == ownership.owned(0, 6, 6) == {0}
    assert ownership.owned(7, 6, 6) == {1} and ownership.owned(5, 2, 6) == ownership.owned(1, 2, 6)


def test_minted_ids_land_on_the_gateways_own_partitions_and_stay_time_ordered() -> None:
    mine = ownership.owned(3, 4, 6)
    ids = [ownership.mint(mine, 6) for _ in range(200)]
    assert {partition_for(gid, 6) for gid in ids} == {3}
    assert ids == sorted(ids) and all(id_time_ms(gid) > 0 for gid in ids)


def test_minting_draws_until_one_fits_and_gives_up_rather_than_spin() -> None:
    drawn: list[str] = []

    def draw() -> str:
        drawn.append(new_id())
        return drawn[-1]

    gid = ownership.mint(frozenset({partition_for("x", 6)}), 6, draw)
    assert drawn[-1] == gid and all(partition_for(d, 6) != partition_for(gid, 6) for d in drawn[:-1])
    with pytest.raises(RuntimeError, match="no id"):
        ownership.mint(frozenset({99}), 6)


class FakeTail:
    """Stands in for a consumer: counts starts and stops, positioned at once (or when ``gate`` opens)."""

    started: list[list[int]] = []
    stopped: list[list[int]] = []
    gate: asyncio.Event | None = None

    def __init__(self, bootstrap: str, topic: str, handle: Any, read: Any, kind: str) -> None:
        self.partitions: list[int] = []

    async def start(self, choose: Callable[[int], Iterable[int]]) -> int:
        self.partitions = sorted(choose(6))
        if FakeTail.gate is not None:
            await FakeTail.gate.wait()
        FakeTail.started.append(self.partitions)
        return 6

    async def stop(self) -> None:
        FakeTail.stopped.append(self.partitions)


@pytest.fixture
def relay(monkeypatch: pytest.MonkeyPatch) -> TokenRelay:
    from producers.gateway import relay as relay_module

    FakeTail.started, FakeTail.stopped, FakeTail.gate = [], [], None
    monkeypatch.setattr(tails, "PartitionTail", FakeTail)
    monkeypatch.setattr(relay_module, "PartitionTail", FakeTail)
    return TokenRelay("unused:9092", "t.chat.tokens", index=0, count=2, linger_s=0.05)


def on(partition: int) -> str:
    return ownership.mint(frozenset({partition}), 6)


async def test_a_gateway_tails_its_own_partitions_and_borrows_nothing_for_its_own_streams(relay: TokenRelay) -> None:
    await relay.start()
    assert FakeTail.started == [[0, 2, 4]] and relay.mine == {0, 2, 4}
    gid = relay.new_generation_id()
    assert relay.owns(gid) and partition_for(gid, 6) in {0, 2, 4}
    q = relay.subscribe(gid)
    await relay.attach(gid)
    relay.unsubscribe(gid, q)
    assert FakeTail.started == [[0, 2, 4]] and relay.borrowed.tails == {}


async def test_streams_of_another_gateways_partition_share_one_borrowed_tail_closed_after_the_last(
        relay: TokenRelay) -> None:
    await relay.start()
    first, second, elsewhere = on(3), on(3), on(5)
    queues = [(first, relay.subscribe(first)), (second, relay.subscribe(second)), (first, relay.subscribe(first))]
    await relay.attach(first)
    await relay.attach(second)
    assert FakeTail.started == [[0, 2, 4], [3]]  # three streams, one reader of partition 3
    assert relay.borrowed.tails[3].users == 3
    for gid, q in queues[:2]:
        relay.unsubscribe(gid, q)
        relay.unsubscribe(gid, q)  # twice: counted once
    assert relay.borrowed.tails[3].users == 1
    last = relay.subscribe(elsewhere)
    await relay.attach(elsewhere)
    relay.unsubscribe(*queues[2])
    await asyncio.sleep(0.2)  # past the linger: partition 3's tail is closed; 5's still has a stream
    assert FakeTail.stopped == [[3]] and list(relay.borrowed.tails) == [5]
    relay.unsubscribe(elsewhere, last)
    await asyncio.sleep(0.2)
    assert FakeTail.stopped == [[3], [5]] and relay.borrowed.tails == {}


async def test_a_stream_that_comes_back_within_the_linger_keeps_the_tail_it_had(relay: TokenRelay) -> None:
    await relay.start()
    gid = on(1)
    relay.unsubscribe(gid, relay.subscribe(gid))
    await relay.attach(gid)
    again = relay.subscribe(gid)  # a reconnect right after the stream dropped
    await asyncio.sleep(0.2)
    assert FakeTail.started == [[0, 2, 4], [1]] and FakeTail.stopped == []
    relay.unsubscribe(gid, again)
    await relay.stop()
    assert sorted(FakeTail.stopped) == [[0, 2, 4], [1]]


async def test_a_replay_of_a_borrowed_partition_waits_until_its_tail_is_positioned(
        relay: TokenRelay, monkeypatch: pytest.MonkeyPatch) -> None:
    """Subscribe, then replay to the end: the live tail must have found its end before the replay reader
    measures its own, or a record produced in between would be in neither."""
    await relay.start()
    FakeTail.gate = asyncio.Event()
    opened: list[int] = []

    async def open_reader(*args: Any, **kwargs: Any) -> Any:
        opened.append(len(FakeTail.started))
        raise ConnectionError("no broker in a unit test")

    from producers.gateway import relay as relay_module
    monkeypatch.setattr(relay_module, "open_reader", open_reader)
    gid = on(3)
    relay.subscribe(gid)
    replay = asyncio.ensure_future(anext(relay.replay(gid, None, 0)))
    await asyncio.sleep(0.05)
    assert opened == [] and not replay.done()  # still waiting for the borrowed tail
    FakeTail.gate.set()
    with pytest.raises(ConnectionError):
        await replay
    assert opened == [2]  # the replay reader opened only after partition 3's tail started
