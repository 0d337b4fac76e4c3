"""Generation workers on real vLLM (CPU), fed through Kafka: lanes, cancel, crash recovery, offsets."""
from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from aiokafka import TopicPartition

from infra.config.settings import Settings
from infra.local.topology import ensure_topics
from schemas import (
    CancelRequested,
    GenerationFinished,
    GenerationRequested,
    GenerationStarted,
    TokensAppended,
    decode_record,
    new_id,
)
from schemas.sampling import Sampling
from tests.e2e.service import Service, free_port
from topics import Topics
from topics.catalogue import GENERATION
from topics.clients import make_consumer, make_producer, send, tail
from topics.partitioning import partition_for

pytestmark = pytest.mark.vllm
ARTIFACTS = Path(__file__).resolve().parents[1] / "artifacts" / "worker-logs"


@pytest.fixture(scope="module")
def pool_env(stack_settings: Settings) -> Iterator[Service]:
    """A topic prefix of this module's own and a way to start workers on it."""
    import os

    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    prefix = f"w{uuid.uuid4().hex[:8]}."
    env = dict(os.environ, PARLEY_TOPIC_PREFIX=prefix, PARLEY_KEYSPACE=stack_settings.keyspace,
               PARLEY_POOL_LARGE_KV_CACHE_GIB="0.5", PYTHONUNBUFFERED="1")
    svc = Service(stack_settings.with_(topic_prefix=prefix), env, ARTIFACTS)
    ensure_topics(svc.settings)
    yield svc
    svc.stop()


def _worker(svc: Service, name: str, capacity: int = 8) -> object:
    proc = svc.start(name, "worker", "--pool", "large", "--capacity", str(capacity),
                     "--metrics-port", str(free_port()))
    return proc


def _request(tokenizer_ids: list[int], lane: str = "paid", max_tokens: int = 24, conversation: str | None = None,
             temperature: float = 0.0, sampling: Sampling | None = None) -> GenerationRequested:
    gid = new_id()
    return GenerationRequested(generation_id=gid, conversation_id=conversation or f"c-{gid}", user_id="u",
                               plan="paid" if lane == "paid" else "free", pool="large", lane=lane,
                               prompt_token_ids=tokenizer_ids, max_tokens=max_tokens, message_id=gid,
                               temperature=temperature, sampling=sampling)


def _prompt(text: str) -> list[int]:
    from consumers.prompt.tokenizer import tokenizer_for
    from infra.config.pools import default_model_dir

    tok = tokenizer_for(str(default_model_dir(Settings.from_env())))
    return tok.chat_ids([{"role": "user", "content": text}])


async def _token_events(settings: Settings, until: set[str],
                        timeout: float = 180) -> dict[str, list[tuple[int, object]]]:
    """Every chat.tokens event per generation until each of ``until`` has finished."""
    topics = Topics(settings.topic_prefix)
    reader = make_consumer(settings.kafka_bootstrap, topics.tokens, group_id=None)
    await reader.start()
    events: dict[str, list[tuple[int, object]]] = {}
    finished: set[str] = set()
    deadline = time.time() + timeout
    try:
        while not until <= finished and time.time() < deadline:
            batch = await reader.getmany(timeout_ms=500)
            for records in batch.values():
                for r in records:
                    e = decode_record(r)
                    events.setdefault(e.generation_id, []).append((r.offset, e))  # type: ignore[attr-defined]
                    if isinstance(e, GenerationFinished):
                        finished.add(e.generation_id)
    finally:
        await reader.stop()
    assert until <= finished, f"not finished: {until - finished}"
    return events


async def test_reply_generated_end_to_end_and_paid_lane_first(pool_env: Service) -> None:
    settings, topics = pool_env.settings, Topics(pool_env.settings.topic_prefix)
    ids = _prompt("What is the capital of France? Answer briefly.")
    free = [_request(ids, "free", 8) for _ in range(3)]
    paid = [_request(ids, "paid", 8) for _ in range(2)]
    producer = make_producer(settings.kafka_bootstrap)
    await producer.start()
    for r in free + paid:  # free ones were queued first
        await send(producer, topics.generate("large", r.lane), r, r.conversation_id)
    await producer.stop()
    proc = _worker(pool_env, "worker-lanes", capacity=1)
    try:
        pool_env.wait_log(proc, "worker ready", 400)  # type: ignore[arg-type]
        events = await _token_events(settings, {r.generation_id for r in free + paid})
    finally:
        proc.kill()  # type: ignore[attr-defined]
    started = sorted((e.first_token_at, gid) for gid, evs in events.items() for _, e in evs
                     if isinstance(e, GenerationStarted))
    order = [gid for _, gid in started]
    assert set(order[:2]) == {r.generation_id for r in paid}, "paid requests did not start first"
    done = {gid: next(e for _, e in evs if isinstance(e, GenerationFinished)) for gid, evs in events.items()}
    first = done[paid[0].generation_id]
    assert "Paris" in first.text and first.status in ("complete", "length") and first.usage.completion_tokens > 0
    for gid, evs in events.items():
        deltas = [e for _, e in evs if isinstance(e, TokensAppended)]
        assert [d.seq for d in deltas] == list(range(len(deltas)))
        assert "".join(d.text for d in deltas) == done[gid].text


async def test_cancel_stops_within_one_step_and_offsets_wait_for_the_unfinished(pool_env: Service) -> None:
    settings, topics = pool_env.settings, Topics(pool_env.settings.topic_prefix)
    long_ids = _prompt("Write a long story about the sea.")
    conv = f"conv-{uuid.uuid4().hex}"  # same conversation: same partition, long one first
    long_req = _request(long_ids, "paid", 400, conversation=conv, temperature=0.0)
    short_req = _request(_prompt("Say yes."), "paid", 4, conversation=conv)
    proc = _worker(pool_env, "worker-cancel", capacity=4)
    producer = make_producer(settings.kafka_bootstrap)
    await producer.start()
    try:
        pool_env.wait_log(proc, "worker ready", 400)  # type: ignore[arg-type]
        reader = await tail(settings.kafka_bootstrap, topics.tokens)
        for r in (long_req, short_req):
            await send(producer, topics.generate("large", "paid"), r, r.conversation_id)
        seen: list[TokensAppended] = []
        short_done = False
        cancel_at = None
        finished: GenerationFinished | None = None
        deadline = time.time() + 180
        while finished is None and time.time() < deadline:
            for records in (await reader.getmany(timeout_ms=300)).values():
                for rec in records:
                    e = decode_record(rec)
                    if isinstance(e, GenerationFinished) and e.generation_id == short_req.generation_id:
                        short_done = True
                    if isinstance(e, TokensAppended) and e.generation_id == long_req.generation_id:
                        seen.append(e)
                    if isinstance(e, GenerationFinished) and e.generation_id == long_req.generation_id:
                        finished = e
            if short_done and cancel_at is None and len(seen) >= 10:
                committed = await _committed(settings, pool_env, topics.generate("large", "paid"), conv)
                record_offset = await _offset_of(settings, topics.generate("large", "paid"), conv)
                assert committed == record_offset, "committed past a request still generating"
                cancel_at = time.time()
                await send(producer, topics.control, CancelRequested(
                    generation_id=long_req.generation_id, conversation_id=conv, user_id="u"),
                    key=long_req.generation_id)
        await reader.stop()
    finally:
        await producer.stop()
        proc.kill()  # type: ignore[attr-defined]
    assert cancel_at is not None and finished is not None
    assert finished.status == "stopped" and finished.usage.completion_tokens < 400
    after = [t for t in seen if t.at > cancel_at]
    assert len(after) <= 2, f"{len(after)} engine steps ran after the cancel"  # at most the step in flight
    assert "".join(t.text for t in seen) == finished.text  # tokens already made stay


async def _offset_of(settings: Settings, topic: str, key: str) -> int:
    reader = make_consumer(settings.kafka_bootstrap, group_id=None)
    await reader.start()
    try:
        tp = TopicPartition(topic, partition_for(key, 4))
        reader.assign([tp])
        await reader.seek_to_beginning(tp)
        for records in (await reader.getmany(tp, timeout_ms=2000)).values():
            for r in records:
                if r.key.decode() == key:
                    return r.offset
    finally:
        await reader.stop()
    raise AssertionError("request not found")


async def _committed(settings: Settings, svc: Service, topic: str, key: str) -> int | None:
    from aiokafka.admin import AIOKafkaAdminClient

    admin = AIOKafkaAdminClient(bootstrap_servers=settings.kafka_bootstrap)
    await admin.start()
    try:
        for _ in range(20):
            offsets = await admin.list_consumer_group_offsets(Topics(settings.topic_prefix).group(GENERATION, "large"))
            meta = offsets.get(TopicPartition(topic, partition_for(key, 4)))
            if meta is not None:
                return meta.offset
            await asyncio.sleep(0.25)
        return None
    finally:
        await admin.close()


async def test_worker_killed_mid_reply_is_continued_by_another(pool_env: Service) -> None:
    import signal

    settings, topics = pool_env.settings, Topics(pool_env.settings.topic_prefix)
    a = _worker(pool_env, "worker-a")
    b = _worker(pool_env, "worker-b")
    pool_env.wait_log(a, "worker ready", 400)  # type: ignore[arg-type]
    pool_env.wait_log(b, "worker ready", 400)  # type: ignore[arg-type]
    await asyncio.sleep(3)  # both in the group before work arrives
    # A question answered in a few tokens, with ignore_eos: only a survivor that kept the request's
    # sampling parameters runs the reply on to its cap.
    # The kill comes a few records in, well before the cap, so a reader that a busy machine holds back for
    # seconds still kills the holder mid-reply.
    req = _request(_prompt("Reply with just the word OK."), "paid", 240, sampling=Sampling(ignore_eos=True, seed=3))
    producer = make_producer(settings.kafka_bootstrap)
    await producer.start()
    await send(producer, topics.generate("large", "paid"), req, req.conversation_id)
    await producer.stop()
    reader = make_consumer(settings.kafka_bootstrap, topics.tokens, group_id=None)
    await reader.start()
    holder, killed = None, False
    try:
        deadline = time.time() + 120
        while not killed and time.time() < deadline:
            for records in (await reader.getmany(timeout_ms=300)).values():
                for rec in records:
                    e = decode_record(rec)
                    if isinstance(e, GenerationStarted) and e.generation_id == req.generation_id:
                        holder = e.worker_id
                    if isinstance(e, GenerationFinished) and e.generation_id == req.generation_id:
                        raise AssertionError("the reply finished before this test read enough of it to kill its holder")
                    if not killed and isinstance(e, TokensAppended) and e.generation_id == req.generation_id \
                            and e.seq >= 4:
                        victim = next(p for p in (a, b) if str(p.popen.pid) in holder)  # type: ignore[attr-defined,operator]
                        victim.kill(signal.SIGKILL)  # type: ignore[attr-defined]
                        killed = True
    finally:
        await reader.stop()
    assert killed
    events = (await _token_events(settings, {req.generation_id}, timeout=240))[req.generation_id]
    deltas = [e for _, e in events if isinstance(e, TokensAppended)]
    finishes = [e for _, e in events if isinstance(e, GenerationFinished)]
    seqs = [d.seq for d in deltas]
    assert seqs == list(range(len(seqs))), "sequence numbers have a gap or a repeat"
    assert len(finishes) == 1, "the reply finished more than once"
    assert "".join(d.text for d in deltas) == finishes[0].text
    assert finishes[0].worker_id != holder  # the survivor finished it
    assert finishes[0].usage.completion_tokens == 240  # counted the saved tokens as its own, ran to the cap
    assert finishes[0].status == "length"
