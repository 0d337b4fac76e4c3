"""On real Kafka: generation workers that offer the sticky assignor share a group with workers that offer only
aiokafka's round-robin (a fleet upgraded one worker at a time), and the group turns sticky once the last
round-robin-only member has left."""
from __future__ import annotations

import asyncio
import time

from aiokafka import AIOKafkaConsumer
from aiokafka.coordinator.assignors.roundrobin import RoundRobinPartitionAssignor

from consumers.generation.assignor import StickyAssignor, strategies
from infra.config.settings import Settings
from topics import Topics
from topics.catalogue import GENERATION
from topics.clients import make_consumer

PARTITIONS = 4


async def _all_assigned(consumers: list[AIOKafkaConsumer], lanes: list[str]) -> None:
    """Until the consumers between them hold every partition of ``lanes``, each exactly once, 60 s at most."""
    want = sorted((t, p) for t in lanes for p in range(PARTITIONS))
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        await asyncio.gather(*(c.getmany(timeout_ms=200) for c in consumers))
        held = sorted((tp.topic, tp.partition) for c in consumers for tp in c.assignment())
        if held == want and all(c.assignment() for c in consumers):
            return
    raise AssertionError(f"never settled: {[sorted(c.assignment()) for c in consumers]}")


def _sticky(consumer: AIOKafkaConsumer) -> StickyAssignor:
    return next(a for a in consumer._coordinator._assignors if isinstance(a, StickyAssignor))  # noqa: SLF001


async def test_an_old_round_robin_worker_and_a_sticky_one_share_the_group(settings: Settings) -> None:
    topics = Topics(settings.topic_prefix)
    group = topics.group(GENERATION, "large")
    lanes = [topics.generate("large", "paid"), topics.generate("large", "free")]

    def consumer(strategy: tuple[object, ...]) -> AIOKafkaConsumer:
        return make_consumer(settings.kafka_bootstrap, *lanes, group_id=group, partition_assignment_strategy=strategy,
                             session_timeout_ms=10_000, heartbeat_interval_ms=1_000)

    old, new = consumer((RoundRobinPartitionAssignor,)), consumer(strategies())
    later = consumer(strategies())
    try:
        await old.start()
        await new.start()
        await _all_assigned([old, new], lanes)  # round-robin, the one protocol both offer
        assert _sticky(new).held == {}  # the sticky assignor was not the group's

        await old.stop()  # the old worker leaves; another upgraded one joins
        await later.start()
        await _all_assigned([new, later], lanes)
        held_new, held_later = _sticky(new).held, _sticky(later).held
        assert held_new and held_later  # both told their assignment by the sticky protocol
        assert {(t, p) for t, ps in held_new.items() for p in ps} == {(tp.topic, tp.partition)
                                                                     for tp in new.assignment()}
    finally:
        for c in (old, new, later):
            await c.stop()
