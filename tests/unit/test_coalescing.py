"""A generation's outputs gathered into records: first at once, then per window or per token count."""
from __future__ import annotations

from consumers.generation.coalescing import PER_STEP, Coalescer, FlushPolicy, Pace
from consumers.generation.engine import StepOutput
from schemas.sampling import TokenLogprob


def out(ids: tuple[int, ...], text: str, logprobs: list[TokenLogprob] | None = None) -> StepOutput:
    return StepOutput(request_id="g", token_ids=ids, text=text, finished=False, logprobs=logprobs)


def test_the_first_output_goes_at_once_then_one_record_per_window() -> None:
    c = Coalescer(FlushPolicy(window_s=0.1, max_tokens=16))
    assert not c.due(0.0)  # nothing gathered
    c.add(out((1,), "The"))
    assert c.due(0.0)
    assert c.take(0.0).text == "The"
    records, now = [], 0.0
    for i in range(2, 12):  # a 36 ms step: the seeds' replica at full batch
        now += 0.036
        c.add(out((i,), f" w{i}"))
        if c.due(now):
            records.append(c.take(now).token_ids)
    assert records == [[2, 3, 4], [5, 6, 7], [8, 9, 10]]  # 3 tokens a record
    assert not c.empty and c.due(now, urgent=True) and c.take(now).token_ids == [11]


def test_enough_tokens_flush_before_the_window_and_logprobs_follow_their_tokens() -> None:
    c = Coalescer(FlushPolicy(window_s=10.0, max_tokens=3))
    c.take(0.0)
    lp = [TokenLogprob("a", -0.1), TokenLogprob("b", -0.2), TokenLogprob("c", -0.3)]
    c.add(out((1, 2), "ab", lp[:2]))
    assert not c.due(0.01)
    c.add(out((3,), "c", lp[2:]))
    assert c.due(0.02)
    batch = c.take(0.02)
    assert (batch.text, batch.token_ids, batch.logprobs) == ("abc", [1, 2, 3], lp)


def test_per_step_makes_a_record_of_every_output() -> None:
    c = Coalescer(PER_STEP)
    c.add(out((1,), "a"))
    c.take(0.0)
    c.add(out((2,), "b"))
    assert c.due(0.0001)
    c.take(0.0001)
    c.add(out((), ""))
    assert c.empty and not c.due(5.0)  # an output with nothing in it is never a record


def test_text_held_for_its_check_makes_one_record_a_chunk_not_one_a_window() -> None:
    c = Coalescer(FlushPolicy(window_s=0.1, max_tokens=4))
    now = 0.0
    for i in range(1, 12):  # the first output, windows passed and more than max_tokens: none of them is due
        c.add(out((i,), f" w{i}"))
        assert not c.due(now, held=True)
        now += 0.036
    assert c.due(now, urgent=True, held=True)  # the chunk is complete (or a finish, a cancel)
    assert c.take(now).token_ids == list(range(1, 12))
    assert not c.due(now + 1.0, urgent=True, held=True)  # nothing gathered


def test_the_pace_asks_for_as_many_steps_a_hand_over_as_fit_in_half_a_window() -> None:
    window = FlushPolicy(window_s=0.1, max_tokens=16, stream_interval=0)
    pace = Pace()
    assert pace.interval(FlushPolicy(window_s=0.1, max_tokens=16)) == 1  # the default: a token at a time
    assert pace.interval(window) == 1  # no pace yet: a token at a time
    for _ in range(200):
        pace.took(0.036, 1)  # the seeds' replica at full batch
    assert pace.interval(window) == 1  # two 36 ms steps would not fit in half a window
    for _ in range(200):
        pace.took(0.024, 2)  # hand-overs of two tokens: the gap per token is what counts
    assert pace.step_s is not None and abs(pace.step_s - 0.012) < 0.001
    assert pace.interval(window) == 4  # 12 ms steps
    for _ in range(200):
        pace.took(0.150, 1)  # a step longer than the window
    assert pace.interval(window) == 1
    pace.took(0.0, 0)  # nothing to learn from
    assert pace.interval(window) == 1
    for _ in range(400):
        pace.took(0.0001, 1)
    assert pace.interval(window) == 16  # never more than a record holds
    assert pace.interval(PER_STEP) == 1  # a record per engine output: every output handed over
    assert pace.interval(FlushPolicy(window_s=0.1, stream_interval=3)) == 3  # configured: fixed
