"""A worker letting go of revoked partitions: only the replies whose requests are on them stop, and the
producer is flushed before the rebalance goes on."""
from __future__ import annotations

import asyncio

from aiokafka import TopicPartition

from consumers.generation.rebalance import let_go


class _Producer:
    def __init__(self) -> None:
        self.flushed = 0

    async def flush(self) -> None:
        self.flushed += 1


async def test_only_the_revoked_partitions_replies_stop_and_the_producer_is_flushed() -> None:
    async def reply() -> None:
        await asyncio.sleep(60)

    active = {key: asyncio.create_task(reply()) for key in
              ("generate.large.paid:0:5", "generate.large.paid:1:7", "generate.large.free:0:3")}
    producer = _Producer()
    await let_go(active, {TopicPartition("generate.large.paid", 0)}, producer, "w0")
    assert active["generate.large.paid:0:5"].cancelled()
    assert not active["generate.large.paid:1:7"].done() and not active["generate.large.free:0:3"].done()
    assert producer.flushed == 1
    await let_go(active, {TopicPartition("generate.large.paid", 2)}, producer, "w0")  # nothing of its own there
    assert producer.flushed == 1
    for task in active.values():
        task.cancel()
    await asyncio.gather(*active.values(), return_exceptions=True)
