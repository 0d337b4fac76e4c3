"""The gateway's delivery without a broker: the relay's fan-out, and one client's stream (replay, then live,
nothing twice; the saved reply when the buffer has aged out)."""
from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import pytest

from infra.stores.conversations import Message
from producers.gateway.relay import Aged, TokenRelay
from producers.gateway.sse import KEEPALIVE
from producers.gateway.streaming import follow, saved_frames
from schemas import GenerationFinished, TokensAppended, Usage, encode

GID = "g1"


def ids(gid: str = GID) -> dict[str, str]:
    return {"generation_id": gid, "conversation_id": "c", "user_id": "u"}


def delta(seq: int, text: str, gid: str = GID) -> TokensAppended:
    return TokensAppended(**ids(gid), seq=seq, text=text, token_ids=[seq])


def done(gid: str = GID) -> GenerationFinished:
    return GenerationFinished(**ids(gid), plan="free", message_id=gid, status="complete", text="ab",
                              usage=Usage(prompt_tokens=3, completion_tokens=2), model="m", pool="large",
                              worker_id="w")


class FakeRelay:
    """``replay`` yields the buffered events after ``after`` (or raises Aged); ``subscribe`` hands a queue."""

    def __init__(self, buffered: list[tuple[int, Any]], aged: bool = False) -> None:
        self.buffered, self.aged = buffered, aged
        self.live: asyncio.Queue[tuple[int, Any]] = asyncio.Queue()
        self.unsubscribed = 0

    def subscribe(self, generation_id: str) -> asyncio.Queue[tuple[int, Any]]:
        return self.live

    def unsubscribe(self, generation_id: str, queue: object) -> None:
        self.unsubscribed += 1

    async def replay(self, generation_id: str, after: int | None, since_ms: int) -> AsyncIterator[tuple[int, Any]]:
        if self.aged:
            raise Aged(generation_id)
        for offset, event in self.buffered:
            if after is None or offset > after:
                yield offset, event

    async def final_event(self, generation_id: str, since_ms: int) -> tuple[int, Any] | None:
        return next(((o, e) for o, e in self.buffered if isinstance(e, GenerationFinished)), None)


async def stream(relay: FakeRelay, after: int | None = None, saved: list[bytes] | None = None,
                 beats: list[int] | None = None) -> list[bytes]:
    beats = [] if beats is None else beats

    async def heartbeat() -> None:
        beats.append(1)

    async def saved_reply() -> list[bytes]:
        return saved or []

    frames = [f async for f in follow(relay, GID, after=after, since_ms=0, queue=None, first=None,  # type: ignore[arg-type]
                                      keepalive_s=0.05, beat_every_s=10, heartbeat=heartbeat, saved=saved_reply)]
    return frames


def kinds(frames: list[bytes]) -> list[str]:
    return [line.split(b": ", 1)[1].decode() for f in frames for line in f.split(b"\n") if line.startswith(b"event")]


async def test_resume_replays_after_the_offset_then_goes_live_skipping_what_was_sent() -> None:
    relay = FakeRelay([(5, delta(0, "a")), (7, delta(1, "b"))])
    for item in [(7, delta(1, "b")), (9, done())]:  # the live tail also saw offset 7
        relay.live.put_nowait(item)
    frames = await stream(relay, after=5)
    assert kinds(frames) == ["delta", "message_end"]
    assert frames[0].startswith(b"id: 7\n") and b'"b"' in frames[0]
    assert relay.unsubscribed == 1


async def test_quiet_streams_get_keepalives() -> None:
    relay = FakeRelay([])
    relay.live.put_nowait((1, delta(0, "a")))

    async def finish_later() -> None:
        await asyncio.sleep(0.12)
        relay.live.put_nowait((2, done()))

    finisher = asyncio.create_task(finish_later())
    beats: list[int] = []
    frames = await stream(relay, after=0, beats=beats)
    await finisher
    assert KEEPALIVE in frames and kinds(frames) == ["delta", "message_end"]
    assert beats, "the reader heartbeat was not refreshed while the client read"


async def test_an_aged_out_reply_is_served_from_the_saved_message() -> None:
    message = Message("c", 0, GID, "assistant", "Paris.", status="stopped", model="m", pool="large",
                      generation_id=GID, tokens_in=3, tokens_out=1)
    frames = await stream(FakeRelay([], aged=True), after=3, saved=saved_frames(message))
    assert kinds(frames) == ["message_start", "snapshot", "message_end"]
    assert b'"stop_reason":"stopped"' in frames[-1]
    assert saved_frames(None) == [] and saved_frames(Message("c", 0, GID, "assistant", "", "generating")) == []


@dataclass
class Record:
    key: bytes
    value: bytes
    offset: int


async def test_the_relay_hands_each_generation_its_own_events_only() -> None:
    relay = TokenRelay("unused:9092", "t.chat.tokens")
    mine, other = relay.subscribe(GID), relay.subscribe("g2")
    await relay._records([Record(b"g1", encode(delta(0, "a")), 4),  # type: ignore[list-item]  # noqa: SLF001
                          Record(b"g3", encode(delta(0, "x", "g3")), 5),
                          Record(b"g1", b"not an event", 6),
                          Record(b"g2", encode(delta(0, "z", "g2")), 7)])
    assert [(o, e.text) for o, e in [mine.get_nowait()]] == [(4, "a")] and mine.empty()
    assert other.get_nowait()[0] == 7
    relay.unsubscribe("g2", other)
    assert "g2" not in relay.subs and GID in relay.subs


async def test_a_dead_workers_stream_says_recovering_once_then_continues(monkeypatch: pytest.MonkeyPatch) -> None:
    from producers.gateway import streaming
    from schemas import GenerationStarted

    monkeypatch.setattr(streaming, "STALL_S", 0.1)
    monkeypatch.setattr(streaming, "CHECK_EVERY_S", 0.02)
    monkeypatch.setattr(streaming, "LOST_AFTER_S", 0.1)
    alive = {"w1": False, "w2": True}

    def started(worker: str) -> GenerationStarted:
        return GenerationStarted(generation_id=GID, conversation_id="c", user_id="u", message_id="m", model="m",
                                 pool="large", worker_id=worker, first_token_at=1.0, prompt_tokens=3)

    relay = FakeRelay([])
    relay.live.put_nowait((1, started("w1")))
    relay.live.put_nowait((2, delta(0, "a")))

    async def take_over() -> None:  # w1 died; after a while w2 resumes the reply
        await asyncio.sleep(0.4)
        for item in [(3, started("w2")), (4, delta(1, "b")), (5, done())]:
            relay.live.put_nowait(item)

    async def worker_alive(worker_id: str) -> bool:
        return alive[worker_id]

    task = asyncio.create_task(take_over())
    frames = [f async for f in streaming.follow(
        relay, GID, after=None, since_ms=0, queue=None, first=None, keepalive_s=10, beat_every_s=10,  # type: ignore[arg-type]
        heartbeat=lambda: asyncio.sleep(0), saved=lambda: asyncio.sleep(0, []), worker_alive=worker_alive)]
    await task
    assert kinds(frames) == ["delta", "recovering", "delta", "message_end"]
    assert b"worker_lost" in frames[1] and not frames[1].startswith(b"id:")  # no id: resume points unchanged


async def test_a_slow_but_live_worker_is_not_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    from producers.gateway import streaming
    from schemas import GenerationStarted

    monkeypatch.setattr(streaming, "STALL_S", 0.05)
    monkeypatch.setattr(streaming, "CHECK_EVERY_S", 0.02)
    relay = FakeRelay([])
    relay.live.put_nowait((1, GenerationStarted(generation_id=GID, conversation_id="c", user_id="u", message_id="m",
                                                model="m", pool="large", worker_id="w", first_token_at=1.0,
                                                prompt_tokens=3)))

    async def later() -> None:
        await asyncio.sleep(0.3)
        relay.live.put_nowait((2, done()))

    task = asyncio.create_task(later())
    frames = [f async for f in streaming.follow(
        relay, GID, after=None, since_ms=0, queue=None, first=None, keepalive_s=10, beat_every_s=10,  # type: ignore[arg-type]
        heartbeat=lambda: asyncio.sleep(0), saved=lambda: asyncio.sleep(0, []),
        worker_alive=lambda w: asyncio.sleep(0, True))]
    await task
    assert kinds(frames) == ["message_end"]


async def test_a_fenced_off_workers_late_appends_and_repeated_chunks_never_reach_the_client() -> None:
    from schemas import GenerationStarted

    def started(epoch: int) -> GenerationStarted:
        return GenerationStarted(generation_id=GID, conversation_id="c", user_id="u", message_id="m", model="m",
                                 pool="large", worker_id=f"w{epoch}", first_token_at=1.0, prompt_tokens=3,
                                 epoch=epoch, resumed=epoch > 1)

    def chunk(seq: int, text: str, epoch: int) -> TokensAppended:
        return TokensAppended(generation_id=GID, conversation_id="c", user_id="u", seq=seq, text=text,
                              token_ids=[seq], epoch=epoch)

    relay = FakeRelay([])
    for item in [(1, started(1)), (2, chunk(0, "a", 1)), (3, chunk(1, "b", 1)),
                 (4, started(2)), (5, chunk(1, "b", 2)),  # the new owner's first chunk repeats no text: seq 1 sent
                 (6, chunk(2, "X", 1)),  # the old owner woke up (SIGCONT) and appended: fenced off
                 (7, chunk(2, "c", 2)), (8, done())]:
        relay.live.put_nowait(item)
    frames = await stream(relay)
    text = b"".join(frames)
    assert kinds(frames) == ["delta", "delta", "delta", "message_end"]
    assert b'"a"' in text and b'"b"' in text and b'"c"' in text and b'"X"' not in text
