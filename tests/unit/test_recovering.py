"""The ``recovering`` event names its cause: a worker gone, Redis down (whose outage lapses every worker's
beat without any worker dying), or Kafka silent (while the worker still beats)."""
from __future__ import annotations

import asyncio

import pytest

from tests.unit.test_streaming import GID, FakeRelay, done, kinds


async def _stalled(monkeypatch: pytest.MonkeyPatch, beats: list[object], stall_s: float = 0.5,
                   kafka_quiet_s: list[float | None] | None = None) -> list[bytes]:
    """A started generation that stalls for ``stall_s`` then finishes; the worker's beat, each time it is
    asked, is the next of ``beats`` (the last repeats; an exception is raised)."""
    from producers.gateway import streaming
    from schemas import GenerationStarted

    monkeypatch.setattr(streaming, "STALL_S", 0.05)
    monkeypatch.setattr(streaming, "CHECK_EVERY_S", 0.02)
    monkeypatch.setattr(streaming, "LOST_AFTER_S", 0.1)
    monkeypatch.setattr(streaming, "REDIS_GRACE_S", 10.0)
    monkeypatch.setattr(streaming, "KAFKA_QUIET_S", 0.3)
    relay = FakeRelay([])
    relay.live.put_nowait((1, GenerationStarted(generation_id=GID, conversation_id="c", user_id="u", message_id="m",
                                                model="m", pool="large", worker_id="w", first_token_at=1.0,
                                                prompt_tokens=3)))

    async def beat(worker_id: str) -> object:
        now = beats.pop(0) if len(beats) > 1 else beats[0]
        if isinstance(now, Exception):
            raise now
        return now

    async def later() -> None:
        await asyncio.sleep(stall_s)
        relay.live.put_nowait((2, done()))

    def quiet() -> float | None:  # the next of ``kafka_quiet_s`` each time it is asked; the last repeats
        assert kafka_quiet_s is not None
        return kafka_quiet_s.pop(0) if len(kafka_quiet_s) > 1 else kafka_quiet_s[0]

    task = asyncio.create_task(later())
    frames = [f async for f in streaming.follow(
        relay, GID, after=None, since_ms=0, queue=None, first=None, keepalive_s=10, beat_every_s=10,  # type: ignore[arg-type]
        heartbeat=lambda: asyncio.sleep(0), saved=lambda: asyncio.sleep(0, []), worker_alive=beat,
        kafka_quiet_s=quiet if kafka_quiet_s is not None else None)]
    await task
    return frames


async def test_a_redis_outage_is_named_and_the_beat_it_lapsed_is_not_a_lost_worker(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from redis.exceptions import ConnectionError as RedisDown

    frames = await _stalled(monkeypatch, [RedisDown("down"), RedisDown("down"), False])
    assert kinds(frames) == ["recovering", "message_end"]
    assert b'"store_unavailable"' in frames[0] and b'"Redis"' in frames[0] and b"worker_lost" not in frames[0]


async def test_a_beat_missing_only_briefly_is_not_a_lost_worker(monkeypatch: pytest.MonkeyPatch) -> None:
    frames = await _stalled(monkeypatch, [False, True])
    assert kinds(frames) == ["message_end"]


async def test_kafka_silent_is_named_once_while_the_worker_still_beats(monkeypatch: pytest.MonkeyPatch) -> None:
    frames = await _stalled(monkeypatch, [True], kafka_quiet_s=[0.1, 0.5, 0.6, 0.7, 0.8])
    assert kinds(frames) == ["recovering", "message_end"]  # once, however many ticks it stays silent
    assert b'"store_unavailable"' in frames[0] and b'"Kafka"' in frames[0] and b"worker_lost" not in frames[0]


async def test_kafka_answering_and_an_unknown_tail_say_nothing_while_the_worker_beats(
        monkeypatch: pytest.MonkeyPatch) -> None:
    assert kinds(await _stalled(monkeypatch, [True], kafka_quiet_s=[0.1])) == ["message_end"]
    assert kinds(await _stalled(monkeypatch, [True], kafka_quiet_s=[None])) == ["message_end"]
