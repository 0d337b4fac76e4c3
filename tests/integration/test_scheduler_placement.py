"""Replica placement on real Kafka and Redis: workers announce the partitions their group gave them, the
scheduler's view places a conversation on a replica and a partition it owns, and that worker is the one that
serves it; past the load cap the request spills to the other replica; a third worker joining takes about its
share of the conversations and moves no other one, and takes its partitions only from the other two, which keep
the rest; a worker leaving moves only its own partitions. The engines are the test double."""
from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

from consumers.generation.announce import ReplicaAnnounced
from consumers.generation.decisions import Limits
from consumers.generation.worker import GenerationWorker
from consumers.scheduler.placement import Ring
from consumers.scheduler.replicas import Replicas
from consumers.scheduler.stage import read_announcements
from infra.config.settings import Settings
from schemas import GenerationRequested, GenerationStarted, decode_record, new_id
from tests.fakes import FakeEngine
from tests.integration.worker_requests import PLANS
from topics import Topics
from topics.catalogue import GENERATION
from topics.clients import make_producer, send, tail

PARTITIONS = 4


def _worker(settings: Settings, worker_id: str) -> GenerationWorker:
    return GenerationWorker(settings, Limits("large", "fake", max_model_len=512), FakeEngine(reply="a b c"),
                            capacity=4, worker_id=worker_id, plans=PLANS)  # type: ignore[arg-type]


async def _settled(redis: Any, group: str, topics: list[str], ids: set[str],
                   each_owns: str | None = None) -> dict[str, ReplicaAnnounced]:
    """The announcements once exactly ``ids`` own every partition of ``topics`` between them, each at least one
    (of ``each_owns``, when given), 60 s at most."""
    deadline, announced = time.monotonic() + 60, {}
    want = sorted((t, p) for t in topics for p in range(PARTITIONS))
    while time.monotonic() < deadline:
        announced = {a.worker_id: a for a in await read_announcements(redis, group)}
        owned = {w: [(t, p) for t, ps in a.partitions.items() for p in ps] for w, a in announced.items()}
        if set(announced) == ids and sorted(x for o in owned.values() for x in o) == want and all(owned.values()) \
                and all(a.partitions.get(each_owns or topics[0]) for a in announced.values() if each_owns):
            return announced
        await asyncio.sleep(0.5)
    raise AssertionError(f"{ids} never settled on {topics}: {announced}")


async def _served_by(settings: Settings, topics: Topics, topic: str, partition: int, conversation: str) -> str:
    """Put a request on ``topic[partition]``; the worker id its GenerationStarted names."""
    reader = await tail(settings.kafka_bootstrap, topics.tokens)
    producer = make_producer(settings.kafka_bootstrap)
    await producer.start()
    gid = new_id()
    try:
        await send(producer, topic, GenerationRequested(
            generation_id=gid, conversation_id=conversation, user_id=f"u-{uuid.uuid4().hex}", plan="paid",
            pool="large", lane="paid", prompt_token_ids=list(range(12)), max_tokens=4, message_id=gid),
            key=conversation, partition=partition)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            for records in (await reader.getmany(timeout_ms=300)).values():
                for r in records:
                    event = decode_record(r)
                    if isinstance(event, GenerationStarted) and event.generation_id == gid:
                        return event.worker_id
        raise AssertionError(f"generation {gid} on {topic}[{partition}] never started")
    finally:
        await producer.stop()
        await reader.stop()


async def test_placement_spill_and_a_join_on_real_kafka(settings: Settings, redis_client: Any) -> None:
    topics = Topics(settings.topic_prefix)
    group, topic = topics.group(GENERATION, "large"), topics.generate("large", "paid")
    lanes = [topic, topics.generate("large", "free")]
    workers: dict[str, GenerationWorker] = {w: _worker(settings, w) for w in ("w-a", "w-b")}
    runs = [asyncio.create_task(w.run()) for w in workers.values()]
    try:
        announced = await _settled(redis_client, group, lanes, {"w-a", "w-b"}, each_owns=topic)
        replicas = Replicas("conversation")
        replicas.update(announced.values())

        # 1. Placement: the replica the scheduler chose is the worker that serves the request.
        conversation = "conv-placed"
        placed = replicas.place(topic, conversation, "g1", list(range(12)))
        assert placed is not None and placed.placement.reason == "home"
        assert placed.placement.replica == Ring(["w-a", "w-b"]).home(conversation)
        assert placed.partition in announced[placed.placement.replica].partitions[topic]
        assert await _served_by(settings, topics, topic, placed.partition, conversation) == placed.placement.replica
        replicas.finished("g1")

        # 2. Spill: the home holds the cap already; the request goes to the other replica, which serves it.
        home = placed.placement.replica
        other = next(w for w in ("w-a", "w-b") if w != home)
        replicas.loads.update({home: 6, other: 0})
        spilled = replicas.place(topic, conversation, "g2", list(range(12)))
        assert spilled is not None and (spilled.placement.replica, spilled.placement.reason) == (other, "spill")
        assert await _served_by(settings, topics, topic, spilled.partition, conversation) == other
        replicas.loads.clear()

        # 3. A third worker joins and Kafka deals the partitions out again: conversations stay on their replica
        # (on whichever partition it owns now) unless the joiner became their home; the joiner takes about its
        # third and nobody else's.
        homes = {f"conv-{i}": Ring(["w-a", "w-b"]).home(f"conv-{i}") for i in range(300)}
        joiner = workers["w-c"] = _worker(settings, "w-c")
        runs.append(asyncio.create_task(joiner.run()))
        after = await _settled(redis_client, group, lanes, {"w-a", "w-b", "w-c"})
        # The partitions too (consumers/generation/assignor.py): the joiner's come only from the others, and
        # nothing moves between the two that stay.
        for w in ("w-a", "w-b"):
            for lane in lanes:
                assert set(after[w].partitions.get(lane, [])) <= set(announced[w].partitions[lane]), (announced, after)
        assert all(after["w-c"].partitions.get(lane) for lane in lanes)
        replicas.update(after.values())
        moved = 0
        for i, (conv, home_before) in enumerate(homes.items()):
            now = replicas.place(lanes[1], conv, f"h{i}", list(range(12)))
            assert now is not None and now.placement.reason == "home"
            assert now.partition in after[now.placement.replica].partitions[lanes[1]]
            assert now.placement.replica in (home_before, "w-c")
            moved += now.placement.replica == "w-c"
            replicas.finished(f"h{i}")
        assert 0.2 < moved / len(homes) < 0.5
        again = replicas.place(topic, conversation, "g3", list(range(12)))
        assert again is not None and again.placement.replica in (home, "w-c")
        assert await _served_by(settings, topics, topic, again.partition, conversation) == again.placement.replica

        # 4. A worker leaves: only its partitions move; the two that stay keep every one they had.
        workers["w-a"].stop()
        await asyncio.wait_for(runs[0], 60)
        left = await _settled(redis_client, group, lanes, {"w-b", "w-c"})
        for w in ("w-b", "w-c"):
            for lane in lanes:
                assert set(after[w].partitions.get(lane, [])) <= set(left[w].partitions[lane]), (after, left)
    finally:
        for worker in workers.values():
            worker.stop()
        await asyncio.wait_for(asyncio.gather(*runs), 60)
    assert await read_announcements(redis_client, group) == []  # each withdrew on stopping
