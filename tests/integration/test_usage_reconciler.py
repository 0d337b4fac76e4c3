"""The usage rollup's reconciler, on real Kafka and Cassandra: records its faust agent was never handed (as
after the stages SIGKILL in the fault suite, where a day row held 1 reply of 2) are counted from the topic,
once each, and only on the partitions this instance holds."""
from __future__ import annotations

import time
import uuid
from datetime import UTC, datetime
from typing import Any

from infra.config.settings import Settings
from infra.stores.records import Records
from schemas import UsageRecorded
from streams.usage_rollup import Reconciler
from topics import Topics
from topics.catalogue import USAGE
from topics.clients import make_producer, send
from topics.partitioning import partition_for


def usage(user: str, day: str, tokens_in: int, tokens_out: int) -> UsageRecorded:
    gen = uuid.uuid4().hex
    return UsageRecorded(generation_id=gen, conversation_id=f"c-{gen}", user_id=user, plan="paid", model="m",
                         pool="small", status="complete", day=day, tokens_in=tokens_in, tokens_out=tokens_out,
                         tokens_cached=0, reserved_tokens=1000, charged_tokens=tokens_in + tokens_out,
                         finished_at=time.time())


async def test_records_the_agent_was_never_handed_are_counted_once(settings: Settings, db: Any) -> None:
    records, topic = Records(db), Topics(settings.topic_prefix).usage
    user, day = uuid.uuid4().hex, datetime.now(UTC).strftime("%Y-%m-%d")
    sent = [usage(user, day, 51, 91), usage(user, day, 51, 71), usage(user, day, 40, 10)]
    producer = make_producer(settings.kafka_bootstrap)
    await producer.start()
    try:
        for r in sent:
            await send(producer, topic, r, key=r.user_id)
    finally:
        await producer.stop()
    first = sent[0]  # the agent counted this one; the other two never reached it
    await records.count_usage(user, day, first.generation_id, first.tokens_in, first.tokens_out, 0)
    counted: list[str] = []

    async def count(r: UsageRecorded) -> bool:
        _, new = await records.count_usage(r.user_id, r.day, r.generation_id, r.tokens_in, r.tokens_out,
                                           r.tokens_cached)
        counted.append(r.generation_id)
        return new

    mine = partition_for(user, USAGE.partitions)
    reconciler = Reconciler(settings, records, count)
    assert await reconciler.run({p for p in range(USAGE.partitions) if p != mine}) == 0  # not this instance's
    assert counted == []
    assert await reconciler.run({mine}) == 2
    assert sorted(counted) == sorted(r.generation_id for r in sent[1:])
    row = await records.usage_day(user, day)
    assert row is not None and (row.replies, row.tokens_in, row.tokens_out) == (3, 142, 172)
    assert await reconciler.run({mine}) == 0  # the next pass overlaps this one's window: nothing twice
    assert len(counted) == 2
    row = await records.usage_day(user, day)
    assert row is not None and (row.replies, row.tokens_in, row.tokens_out) == (3, 142, 172)
