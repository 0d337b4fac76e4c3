"""The worker's flush clock with one reply run on a scripted engine: tokens made before a long engine step leave
as a record while the step runs (on time), not with the step's own output (at outputs only); the first record
stays the loop's, behind GenerationStarted; a failed flush on the clock surfaces in the reply's loop; replies
flushed together leave in groups, each a window apart, and one that missed its group's tick leaves at its next
output."""
from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiokafka.errors import KafkaTimeoutError

from consumers.generation.coalescing import PACE_SHARE, FlushPolicy, Pace
from consumers.generation.decisions import Generate, Limits
from consumers.generation.engine import StepOutput
from consumers.generation.flush_clock import FlushClock
from consumers.generation.metrics import WorkerMetrics
from consumers.generation.recovery import Saved
from consumers.generation.reply_run import ReplyRun
from consumers.generation.sim_engine import _Slot
from consumers.safety.classifier import Verdict
from consumers.safety.output import OutputGuard
from infra.config.safety import PlanPolicy
from schemas import GenerationRequested, GenerationStarted, TokensAppended
from schemas.codec import decode
from topics import Topics


class _Producer:
    def __init__(self, fail_after: int | None = None) -> None:
        self.sent: list[tuple[float, Any]] = []  # (when, the decoded event)
        self.fail_after = fail_after

    async def send(self, topic: str, value: bytes, key: bytes, partition: int | None = None) -> asyncio.Future[Any]:
        if self.fail_after is not None and len(self.sent) >= self.fail_after:
            raise KafkaTimeoutError()
        self.sent.append((time.monotonic(), decode(value, key=key)))
        done: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        done.set_result(None)
        return done


class _Appender:
    def __init__(self, producer: _Producer) -> None:
        self.producer = producer

    def partition(self, topic: str, key: str) -> int | None:
        return None

    async def landed(self, generation_id: str, futures: list[asyncio.Future[Any]]) -> None:
        await asyncio.gather(*futures)


class _Fence:
    def epoch(self, generation_id: str) -> int:
        return 0

    async def fenced(self, generation_id: str) -> bool:
        return False


class _Finisher:
    def __init__(self) -> None:
        self.finished: list[Any] = []

    async def finish(self, event: Any) -> None:
        self.finished.append(event)


async def _delivered(gid: str, script: list[tuple[float, str, bool]], gate: Any,
                     arrived: list[float]) -> AsyncIterator[StepOutput]:
    """Outputs made on the script's schedule whoever reads them, as an engine's are, handed over as the
    simulated engine does (those not taken yet joined into one); with a gate, read at its ticks."""
    slot = _Slot(gate)

    async def make() -> None:
        for i, (delay, text, finished) in enumerate(script):
            await asyncio.sleep(delay)
            arrived.append(time.monotonic())
            slot.put(StepOutput(request_id=gid, token_ids=(i + 1,), text=text, finished=finished,
                                finish_reason="stop" if finished else None))

    maker = asyncio.create_task(make())
    try:
        finished = False
        while not finished:
            out = await slot.get()
            finished = out.finished
            yield out
            if gate is not None and not finished:
                await gate.wait()
    finally:
        maker.cancel()


class _Engine:
    """Outputs at scripted delays: (seconds before it, text, finished)."""

    def __init__(self, script: list[tuple[float, str, bool]]) -> None:
        self.script, self.arrived, self.intervals = script, list[float](), list[int]()
        self.handed = 0  # outputs the reply's loop took (joined ones count once)

    async def generate(self, gid: str, prompt: list[int], max_tokens: int, priority: int,
                       sampling: Any, gate: Any = None) -> AsyncIterator[StepOutput]:
        self.intervals.append(sampling.stream_interval)
        async for out in _delivered(gid, self.script, gate, self.arrived):
            self.handed += 1
            yield out

    async def abort(self, gid: str) -> None:
        pass


class _Crew:
    def __init__(self, engine: _Engine, flush: FlushPolicy, producer: _Producer) -> None:
        self.engine, self.flush, self.clock, self.pace = engine, flush, FlushClock(flush), Pace()
        self.limits = Limits("large", "m", 4096)
        self.worker_id, self.topics = "w", Topics("t")
        self.appender, self.fence, self.cancels = _Appender(producer), _Fence(), set[str]()
        self.metrics, self.safety, self.finisher, self.redis = WorkerMetrics("large"), None, _Finisher(), None

    async def seal(self, event: Any) -> Any:
        return event


# "a" at once, "b" 10 ms later, then a 300 ms step (a prefill in the batch) before "c", the last.
SCRIPT = [(0.0, "a", False), (0.01, "b", False), (0.3, "c", True)]
WINDOW = FlushPolicy(window_s=0.05, max_tokens=16)


async def _run(flush: FlushPolicy, producer: _Producer | None = None,
               script: list[tuple[float, str, bool]] = SCRIPT, crew: _Crew | None = None
               ) -> tuple[_Crew, _Engine, _Producer]:
    engine, producer = _Engine(script), producer or _Producer()
    if crew is None:
        crew = _Crew(engine, flush, producer)
    else:
        crew.engine, crew.appender = engine, _Appender(producer)
    req = GenerationRequested(generation_id="g", conversation_id="c", user_id="u", plan="paid", pool="large",
                              lane="paid", prompt_token_ids=[1, 2, 3], max_tokens=20)
    clock = asyncio.create_task(crew.clock.run())
    try:
        await ReplyRun(crew, req, Generate([1, 2, 3], 20, 0, False, 0), Saved(), time.time()).stream()
    finally:
        clock.cancel()
    return crew, engine, producer


def _tokens(producer: _Producer) -> list[tuple[float, str]]:
    return [(at, e.text) for at, e in producer.sent if isinstance(e, TokensAppended)]


async def test_on_time_the_tokens_before_a_long_step_leave_while_it_runs() -> None:
    crew, engine, producer = await _run(WINDOW)
    assert isinstance(producer.sent[0][1], GenerationStarted)  # the first record stays behind the announcement
    records = _tokens(producer)
    assert [text for _, text in records] == ["a", "b", "c"]
    b_sent, c_arrived = records[1][0], engine.arrived[2]
    assert b_sent < c_arrived - 0.15  # out ~50 ms into the 300 ms step, not with its output
    assert [e.seq for _, e in producer.sent if isinstance(e, TokensAppended)] == [0, 1, 2]
    finished = crew.finisher.finished[0]
    assert (finished.text, finished.last_seq, finished.status) == ("abc", 2, "complete") and not crew.clock.runs


async def test_at_outputs_only_the_long_step_holds_them() -> None:
    crew, engine, producer = await _run(FlushPolicy(window_s=0.05, max_tokens=16, on_time=False))
    records = _tokens(producer)
    assert [text for _, text in records] == ["a", "bc"]
    assert records[1][0] >= engine.arrived[2]
    assert crew.clock.tick_s == 0


async def test_a_failed_flush_on_the_clock_ends_the_reply_in_its_loop() -> None:
    # GenerationStarted and "a" go out; the clock's flush of "b" fails: the loop raises it at its next output,
    # as a Kafka outage the request waits out (nothing finished, "c" never recorded)
    producer = _Producer(fail_after=2)
    with pytest.raises(KafkaTimeoutError):
        await _run(WINDOW, producer)
    assert [text for _, text in _tokens(producer)] == ["a"]


async def test_a_reply_let_go_mid_step_gets_no_record_from_the_clock() -> None:
    # A rebalance cancels the reply's task during the long step, with "b" gathered: nothing more is written
    # for it (the next owner resumes from what landed).
    engine, producer = _Engine(SCRIPT), _Producer()
    crew = _Crew(engine, FlushPolicy(window_s=0.2, max_tokens=16), producer)
    req = GenerationRequested(generation_id="g", conversation_id="c", user_id="u", plan="paid", pool="large",
                              lane="paid", prompt_token_ids=[1, 2, 3], max_tokens=20)
    clock = asyncio.create_task(crew.clock.run())
    run = asyncio.create_task(ReplyRun(crew, req, Generate([1, 2, 3], 20, 0, False, 0), Saved(),
                                       time.time()).stream())
    await asyncio.sleep(0.03)  # "a" written, "b" gathered, its group's first tick (at 50 ms) not come
    run.cancel()
    await asyncio.sleep(0.3)  # past "b"'s window: the clock would have flushed it
    clock.cancel()
    assert [text for _, text in _tokens(producer)] == ["a"] and not crew.clock.runs


class _Engines(_Engine):
    """A script per generation, all on one engine."""

    def __init__(self, scripts: dict[str, list[tuple[float, str, bool]]]) -> None:
        super().__init__([])
        self.scripts = scripts

    async def generate(self, gid: str, prompt: list[int], max_tokens: int, priority: int,
                       sampling: Any, gate: Any = None) -> AsyncIterator[StepOutput]:
        async for out in _delivered(gid, self.scripts[gid], gate, []):
            yield out


async def _two_replies(flush: FlushPolicy) -> dict[str, list[float]]:
    """Two replies a token every 10 ms, the second starting 25 ms after the first: when each one's records
    after its first (and before its last) were handed over."""
    steady = [(0.01, "x", False)] * 30 + [(0.01, "y", True)]
    engine, producer = _Engines({"g1": steady, "g2": [(0.025, "x", False)] + steady}), _Producer()
    crew = _Crew(engine, flush, producer)

    async def reply(gid: str) -> None:
        req = GenerationRequested(generation_id=gid, conversation_id="c", user_id="u", plan="paid", pool="large",
                                  lane="paid", prompt_token_ids=[1, 2, 3], max_tokens=40)
        await ReplyRun(crew, req, Generate([1, 2, 3], 40, 0, False, 0), Saved(), time.time()).stream()

    clock = asyncio.create_task(crew.clock.run())
    try:
        await asyncio.gather(reply("g1"), reply("g2"))
    finally:
        clock.cancel()
    sent: dict[str, list[float]] = {"g1": [], "g2": []}
    for at, e in producer.sent:
        if isinstance(e, TokensAppended):
            sent[e.generation_id].append(at)
    return {gid: times[1:-1] for gid, times in sent.items()}


async def test_together_each_group_leaves_on_its_own_tick_a_window_apart() -> None:
    sent = await _two_replies(FlushPolicy(window_s=0.08, max_tokens=16, flush_groups=4))
    assert len(sent["g1"]) >= 2 and len(sent["g2"]) >= 2
    for gid in sent:  # each reply's records a window apart (80 ms), not a tick (20 ms) or a tenth (8 ms)
        gaps = [b - a for a, b in itertools.pairwise(sent[gid])]
        assert all(0.05 < g < 0.16 for g in gaps), (gid, gaps)
    for at in sent["g2"]:  # the second reply is in the next group: never in the first's burst
        assert min(abs(at - other) for other in sent["g1"]) > 0.01, sent


async def test_in_two_groups_the_clock_ticks_twice_a_window_and_each_reply_keeps_its_window() -> None:
    policy = FlushPolicy(window_s=0.08, max_tokens=16, flush_groups=2)
    assert (policy.groups, policy.tick_s) == (2, 0.04)
    sent = await _two_replies(policy)
    assert len(sent["g1"]) >= 2 and len(sent["g2"]) >= 2
    for gid in sent:  # a window apart (80 ms), not a tick (40 ms)
        gaps = [b - a for a, b in itertools.pairwise(sent[gid])]
        assert all(0.05 < g < 0.16 for g in gaps), (gid, gaps)
    for at in sent["g2"]:  # the second reply is the other group: half a window from the first's burst
        assert min(abs(at - other) for other in sent["g1"]) > 0.02, sent


async def test_each_on_its_own_window_the_replies_records_are_staggered() -> None:
    sent = await _two_replies(FlushPolicy(window_s=0.08, max_tokens=16, together=False))
    assert len(sent["g1"]) >= 2 and len(sent["g2"]) >= 2
    apart = [min(abs(at - other) for other in sent["g1"]) for at in sent["g2"]]
    assert max(apart) > 0.01, sent  # the second reply keeps its own window, 25 ms after the first's


async def test_together_a_reply_that_had_nothing_at_a_tick_leaves_at_its_next_output() -> None:
    # Ticks ~80 ms apart: "b" leaves at the first; a 180 ms step leaves nothing for the second, so "c" goes out
    # as it arrives (a gap of the step), not at the third tick, nor with the finish
    script = [(0.0, "a", False), (0.01, "b", False), (0.18, "c", False), (0.02, "d", True)]
    _, engine, producer = await _run(FlushPolicy(window_s=0.08, max_tokens=16), script=script)
    records = _tokens(producer)
    assert [text for _, text in records] == ["a", "b", "c", "d"]
    assert records[2][0] - engine.arrived[2] < 0.01


async def test_drained_at_the_tick_the_loop_wakes_once_a_window_and_at_once_for_the_finish() -> None:
    # 31 outputs 10 ms apart; a window of 80 ms. Drained, the loop takes the first output, then one joined
    # output a tick of its group, then the finish as it is made; taking each output, it wakes 31 times.
    script = [(0.01, "x", False)] * 30 + [(0.01, "y", True)]
    window = FlushPolicy(window_s=0.08, max_tokens=64)
    assert window.drain_at_tick
    crew, drained, producer = await _run(window, script=script)
    records = _tokens(producer)
    assert "".join(text for _, text in records) == "x" * 30 + "y"
    assert drained.handed == len(records) <= 7, (drained.handed, len(records))
    assert records[-1][0] - drained.arrived[-1] < 0.015  # the finish woke the loop: no wait for a tick
    for a, b in itertools.pairwise([at for at, _ in records[1:-1]]):
        assert 0.05 < b - a < 0.12  # a window apart
    assert not crew.clock.runs and not crew.clock._waiting
    _, each, again = await _run(FlushPolicy(window_s=0.08, max_tokens=64, drain_at_tick=False), script=script)
    assert each.handed == 31 and "".join(text for _, text in _tokens(again)) == "x" * 30 + "y"


async def test_drained_a_record_leaves_when_its_tokens_are_taken_even_after_ticks_before_the_first() -> None:
    # The prompt waits 100 ms (its group ticks meanwhile), then a token every 10 ms. Each record leaves within a
    # few ms of its newest token being made: the loop makes it at the tick that takes it, not the clock a window
    # later (which, once it had happened, kept every later record a window behind).
    script = [(0.1, "a", False)] + [(0.01, "x", False)] * 40 + [(0.01, "y", True)]
    _, engine, producer = await _run(FlushPolicy(window_s=0.08, max_tokens=64), script=script)
    shown, stale = 0, []
    for at, text in _tokens(producer):
        shown += len(text)
        stale.append(at - engine.arrived[shown - 1])
    assert shown == 42 and len(stale) >= 5
    assert max(stale) < 0.03, stale
    gaps = [b - a for a, b in itertools.pairwise([at for at, _ in _tokens(producer)][1:-1])]
    assert all(0.05 < g < 0.12 for g in gaps), gaps  # still a window apart


async def test_a_reply_asks_the_engine_for_as_many_tokens_a_hand_over_as_the_pace_fits_in_the_window() -> None:
    steady = [(0.0, "a", False)] + [(0.005, f" w{i}", False) for i in range(30)] + [(0.005, ".", True)]
    by_pace = FlushPolicy(window_s=0.05, max_tokens=16, stream_interval=0)
    crew, engine, _ = await _run(by_pace, script=steady)
    assert engine.intervals == [1]  # no pace learnt yet: a token at a time
    assert crew.pace.step_s is not None and 0.004 < crew.pace.step_s < 0.02
    learnt = crew.pace.step_s
    _, again, _ = await _run(by_pace, script=steady, crew=crew)
    assert again.intervals == [max(1, int(PACE_SHARE * by_pace.window_s / learnt))] and again.intervals[0] > 1
    crew.flush = WINDOW  # the same learnt pace
    _, default, _ = await _run(WINDOW, script=steady, crew=crew)
    assert default.intervals == [1]  # the shipped default: a token at a time
    _, fixed, _ = await _run(FlushPolicy(window_s=0.05, stream_interval=3), script=SCRIPT)
    assert fixed.intervals == [3]


class _Safety:
    """Flags a chunk that says "bad"; hold-back 0 in chunks of two tokens. Its check yields to the event loop for
    longer than the window, as a classifier on another process would, so the clock could flush meanwhile."""

    def __init__(self) -> None:
        self.retracted: list[int] = []

    def start(self, plan: str, purpose: str) -> OutputGuard:
        return OutputGuard(PlanPolicy(hold_back_sentences=0, chunk_tokens=2))

    async def check(self, guard: OutputGuard, req: Any) -> Verdict:
        await asyncio.sleep(0.08)
        flagged = "bad" in guard.window()
        return Verdict(flagged=flagged, category="test" if flagged else "none", score=float(flagged),
                       rules_version="t", source="rule")

    async def retract(self, producer: Any, redis: Any, topic: str, req: Any, verdict: Verdict, shown: int) -> str:
        self.retracted.append(shown)
        return "removed"


async def test_shown_at_once_the_hand_over_that_completes_a_flagged_chunk_is_never_shown() -> None:
    """Hold-back 0 shows text as it comes and checks each chunk: the output completing a chunk arrives after its
    window has passed, so it would be due at once, yet it waits for the verdict, and neither the loop nor the
    clock shows it while the check runs."""
    script = [(0.0, "a", False), (0.12, " bad", False), (0.01, " more", True)]
    crew = _Crew(_Engine([]), WINDOW, _Producer())
    crew.safety = _Safety()  # type: ignore[assignment]
    crew, _, producer = await _run(WINDOW, script=script, crew=crew)
    assert [text for _, text in _tokens(producer)] == ["a"]  # the first record, at once; " bad" never
    assert crew.safety.retracted == [0]  # type: ignore[attr-defined]
    finished = crew.finisher.finished[0]
    assert (finished.status, finished.text, finished.last_seq) == ("blocked", "removed", 0)
