"""The load generator's pure parts: the arrival process, the workload's turns, a request's figures, SSE frames."""
from __future__ import annotations

import random
import statistics

import pytest

from producers.loadgen import arrivals
from producers.loadgen.arrivals import Phase
from producers.loadgen.client import Frame, on_frame, parse_frame
from producers.loadgen.record import RequestRecord
from producers.loadgen.stats import pct, per, summary
from producers.loadgen.workload import User, Workload, message_text, mix_users


def test_poisson_arrivals_hold_the_rate_inside_the_bounds() -> None:
    times = arrivals.poisson(4.0, 500.0, random.Random(1))

    assert all(0 <= t < 500 for t in times) and times == sorted(times)
    assert len(times) / 500 == pytest.approx(4.0, rel=0.05)
    gaps = [b - a for a, b in zip(times, times[1:], strict=False)]
    assert statistics.fmean(gaps) == pytest.approx(0.25, rel=0.05)
    assert statistics.pstdev(gaps) == pytest.approx(0.25, rel=0.1)  # exponential: the sd equals the mean


def test_schedule_follows_its_phases_and_stops_at_the_limit() -> None:
    phases = (Phase(100, 2.0), Phase(100, 8.0))
    times = arrivals.schedule(phases, seed=3)

    first = [t for t in times if t < 100]
    assert len(first) == pytest.approx(200, rel=0.2) and len(times) - len(first) == pytest.approx(800, rel=0.1)
    assert arrivals.schedule(phases, seed=3) == times  # seeded: the same run twice
    assert arrivals.schedule(phases, seed=3, limit=10) == times[:10]
    assert arrivals.duration(phases) == 200
    assert arrivals.rate_at(phases, 150) == 8.0 and arrivals.rate_at(phases, 250) == 0.0
    assert arrivals.poisson(0.0, 10, random.Random()) == []


def _users() -> list[User]:
    return mix_users([User("p1", "tp1", "paid")], [User("f1", "tf1", "free"), User("f2", "tf2", "free")])


def test_users_are_interleaved_by_plan() -> None:
    assert [u.plan for u in _users()] == ["free", "paid", "free"]


def test_follow_ups_reuse_idle_conversations_up_to_max_turns() -> None:
    load = Workload(_users(), random.Random(0), max_turns=3, follow_share=1.0, message_tokens=20)
    first = load.next_turn()
    second = load.next_turn()  # the first is still busy: a new conversation
    assert (first.number, second.number) == (0, 0) and first.conversation is not second.conversation

    load.finished(first)
    third = load.next_turn()
    assert third.conversation is first.conversation and third.number == 1
    load.finished(second)
    load.finished(third)
    turns = [load.next_turn() for _ in range(2)]
    for t in turns:
        load.finished(t)
    assert max(c.turns for c in load.conversations) <= 3


def test_message_text_is_about_the_asked_length_and_differs_per_turn() -> None:
    rng = random.Random(0)
    a, b = message_text(rng, 300, 1, 0), message_text(rng, 300, 1, 1)
    assert a != b
    assert 200 <= len(a.split()) <= 260  # ~0.75 words a token


def test_percentiles_and_summary() -> None:
    assert pct([1, 2, 3, 4], 50) == 2.5
    assert pct([5], 99) == 5
    s = summary([0.010, 0.020, None, 0.030], scale=1000)
    assert s["n"] == 3 and s["p50"] == 20.0 and s["max"] == 30.0
    assert summary([]) == {"n": 0}
    assert per(10, 0) is None and per(1, 4, 1000) == 250.0


def _record() -> RequestRecord:
    r = RequestRecord(0, "paid", 0, sent=100.0, status=200)
    for frame in (Frame(100.2, "message_start", {"generation_id": "g", "model": "m", "pool": "large"}),
                  Frame(100.3, "queued", {"position": 3, "estimated_wait_s": 1.5}),
                  Frame(101.0, "delta", {"text": "ab"}), Frame(101.1, "delta", {"text": "c"}),
                  Frame(101.4, "delta", {"text": "d"})):
        assert not on_frame(frame, r)
    assert on_frame(Frame(101.5, "message_end", {"stop_reason": "end", "model": "m",
                                                 "usage": {"in": 10, "out": 4}}), r)
    return r


def test_record_gives_ttft_itl_tpot_and_the_real_wait() -> None:
    r = _record()

    assert r.ok and r.chars == 4 and r.generation_id == "g"
    assert r.ttft == pytest.approx(1.0)
    assert r.gaps() == pytest.approx([0.1, 0.3])
    assert r.tpot == pytest.approx(0.4 / 3)
    assert r.shown_wait_s == 1.5 and r.real_wait_s == pytest.approx(0.7)


def test_error_events_and_frames() -> None:
    r = RequestRecord(0, "free", 0, sent=0.0, status=200)
    on_frame(Frame(1.0, "error", {"code": "queue_full", "retry_after_s": 4}), r)
    assert not r.ok and r.error == "queue_full" and r.retry_after_s == 4

    assert parse_frame(b"id: 7\nevent: delta\ndata: {\"text\": \"x\"}", 1.0) == Frame(1.0, "delta", {"text": "x"}, 7)
    assert parse_frame(b": keep-alive", 1.0) is None
