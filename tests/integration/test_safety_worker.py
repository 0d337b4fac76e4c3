"""The output check in a real generation worker (vLLM on the CPU, real classifier, real Kafka and Redis).

The rules file flags "solar system" in replies only; asked greedily which planet is the largest
in our solar system, SmolLM2-135M answers "The largest planet in our solar system is Jupiter."
"""
from __future__ import annotations

import asyncio
import os
import shutil
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from consumers.safety.output import SENTENCE_BREAK
from infra.config.settings import Settings
from infra.local.topology import ensure_topics
from infra.stores import keys
from schemas import GenerationFinished, GenerationRetracted, GenerationStarted, TokensAppended, decode_record
from tests.e2e.service import Proc, Service, free_port
from tests.integration.test_generation_worker import _prompt, _request
from topics import Topics
from topics.clients import make_producer, send, tail

pytestmark = pytest.mark.vllm
ARTIFACTS = Path(__file__).resolve().parents[1] / "artifacts" / "safety-worker-logs"
RULES = Path(__file__).with_name("data") / "safety.toml"
QUESTION = "Which planet is the largest in our solar system?"


@pytest.fixture(scope="module")
def rules_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("rules") / "safety.toml"
    shutil.copy(RULES, path)
    return path


@pytest.fixture(scope="module")
def worker(stack_settings: Settings, rules_file: Path) -> Iterator[tuple[Service, Proc]]:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    prefix = f"s{uuid.uuid4().hex[:8]}."
    env = dict(os.environ, PARLEY_TOPIC_PREFIX=prefix, PARLEY_KEYSPACE=stack_settings.keyspace,
               PARLEY_POOL_LARGE_KV_CACHE_GIB="1", PARLEY_SAFETY_FILE=str(rules_file), PYTHONUNBUFFERED="1")
    svc = Service(stack_settings.with_(topic_prefix=prefix), env, ARTIFACTS)
    ensure_topics(svc.settings)
    proc = svc.start("worker-safety", "worker", "--pool", "large", "--capacity", "4",
                     "--metrics-port", str(free_port()))
    try:
        svc.wait_log(proc, "worker ready", 400)
        yield svc, proc
    finally:
        svc.stop()


async def _generate(svc: Service, lane: str, max_tokens: int = 64,
                    question: str = QUESTION) -> list[tuple[int, object]]:
    """Send one request and return its chat.tokens events (offset, event) up to its finish."""
    settings, topics = svc.settings, Topics(svc.settings.topic_prefix)
    req = _request(_prompt(question), lane, max_tokens)
    reader = await tail(settings.kafka_bootstrap, topics.tokens)
    producer = make_producer(settings.kafka_bootstrap)
    await producer.start()
    events: list[tuple[int, object]] = []
    try:
        await send(producer, topics.generate("large", lane), req, req.conversation_id)
        deadline = time.time() + 180
        while not any(isinstance(e, GenerationFinished) for _, e in events) and time.time() < deadline:
            for records in (await reader.getmany(timeout_ms=300)).values():
                events += [(r.offset, e) for r in records
                           if getattr(e := decode_record(r), "generation_id", None) == req.generation_id]
    finally:
        await producer.stop()
        await reader.stop()
    assert any(isinstance(e, GenerationFinished) for _, e in events), "the reply never finished"
    return sorted(events, key=lambda item: item[0])


def _parts(events: list[tuple[int, object]]) -> tuple[list[TokensAppended], GenerationRetracted | None,
                                                         GenerationFinished]:
    steps = [e for _, e in events if isinstance(e, TokensAppended)]
    retracted = next((e for _, e in events if isinstance(e, GenerationRetracted)), None)
    finished = next(e for _, e in events if isinstance(e, GenerationFinished))
    return steps, retracted, finished  # type: ignore[return-value]


async def test_hold_back_0_shows_the_text_then_retracts_it_and_stops_at_once(worker: tuple[Service, Proc],
                                                                             redis_client: object) -> None:
    svc, _ = worker
    events = await _generate(svc, "paid")  # the rules' paid plan: hold-back 0
    steps, retracted, finished = _parts(events)
    shown = "".join(s.text for s in steps)
    # Shown a flush window at a time, checked a chunk at a time: the flagged chunk is withdrawn whether or not
    # its window had passed (what had not is never shown at all).
    assert steps and "largest planet" in shown.lower()
    assert retracted is not None and retracted.block.category == "astronomy"
    assert retracted.block.rules_version == "it-1" and retracted.last_seq == steps[-1].seq
    offsets = {id(e): o for o, e in events}
    assert all(offsets[id(s)] < offsets[id(retracted)] for s in steps)  # nothing appended after the cut
    assert (finished.status, finished.text, finished.block) == ("blocked", retracted.notice, retracted.block)
    assert "solar" not in finished.text.lower()
    # Stopped within one step: the reply ended at the flagged chunk, long before its cap, and every token the
    # engine made is counted for the bill, shown or not.
    made = sum(len(s.token_ids) for s in steps)
    assert made <= finished.usage.completion_tokens < 20 and "Jupiter" not in shown
    assert await redis_client.get(keys.generation_retracted(finished.generation_id)) == str(  # type: ignore[attr-defined]
        retracted.last_seq).encode()


async def test_hold_back_1_never_shows_the_flagged_sentence(worker: tuple[Service, Proc]) -> None:
    svc, _ = worker
    events = await _generate(svc, "free")  # the rules' free plan: one sentence held back
    steps, retracted, finished = _parts(events)
    assert steps == [] and retracted is not None and retracted.last_seq == -1
    assert any(isinstance(e, GenerationStarted) for _, e in events)
    assert finished.status == "blocked" and finished.last_seq == -1
    assert finished.usage.completion_tokens > 0  # produced, never shown, still counted


async def test_held_text_passed_by_its_check_comes_a_record_a_chunk(worker: tuple[Service, Proc]) -> None:
    """The free plan's text is shown only once its chunk passes the check, so it is written a record a chunk:
    a record a flush window would be shown no sooner, and cost a record and an event each."""
    svc, _ = worker
    # Several sentences: the worker takes the engine's outputs a flush tick at a time (joined), so a one-sentence
    # answer can come in one record with its finish.
    events = await _generate(svc, "free", question="Describe Paris in three short sentences.", max_tokens=60)
    steps, retracted, finished = _parts(events)
    assert retracted is None and finished.status in ("complete", "length") and len(steps) >= 2
    assert "".join(s.text for s in steps) == finished.text
    assert sum(len(s.token_ids) for s in steps) == finished.usage.completion_tokens
    chunk_tokens = 8  # tests/integration/data/safety.toml, plans.free
    for s in steps[:-1]:  # each a whole chunk: its token count reached, or a sentence ended
        assert len(s.token_ids) >= chunk_tokens or SENTENCE_BREAK.search(s.text), (s.seq, len(s.token_ids), s.text)


async def test_new_rules_apply_without_restarting_the_worker(worker: tuple[Service, Proc], rules_file: Path) -> None:
    svc, proc = worker
    pid = proc.popen.pid
    text = rules_file.read_text().replace('version = "it-1"', 'version = "it-2"')
    rules_file.write_text(text.replace('phrase = "solar system"', 'phrase = "no such phrase at all"'))
    await asyncio.sleep(1.5)  # the worker looks at the file's mtime at most once a second
    try:
        steps, retracted, finished = _parts(await _generate(svc, "paid"))
    finally:
        shutil.copy(RULES, rules_file)
    assert retracted is None and finished.status in ("complete", "length")
    assert "solar system" in finished.text.lower() and finished.text == "".join(s.text for s in steps)
    assert proc.popen.poll() is None and proc.popen.pid == pid
    assert "safety rules reloaded: version it-1 -> it-2" in proc.log.read_text()
