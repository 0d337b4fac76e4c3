"""The worker's per-reply state on its own: engine outputs in, numbered records out, a resumed reply continuing
its saved sequence, the hold-back's unshown text, a retraction and the usage a finish carries."""
from __future__ import annotations

from consumers.generation.coalescing import PER_STEP, FlushPolicy
from consumers.generation.decisions import Generate
from consumers.generation.engine import StepOutput
from consumers.generation.recovery import Saved
from consumers.generation.reply_stream import FENCE_CHECK_GAP_S, ReplyStream
from schemas import GenerationStarted, TokensAppended


def _out(text: str, ids: tuple[int, ...], finished: bool = False, cached: int = 0) -> StepOutput:
    return StepOutput(request_id="g", token_ids=ids, text=text, finished=finished,
                      finish_reason="stop" if finished else None, cached_prompt_tokens=cached)


def _fresh(flush: FlushPolicy = PER_STEP) -> ReplyStream:
    return ReplyStream("g", "c", 12, Generate([1] * 12, 64, 0, False, 0), Saved(), flush)


def test_each_output_becomes_a_numbered_record_and_the_first_is_announced() -> None:
    state = _fresh()
    first = state.took(_out("Hel", (1,), cached=8), 100.0)
    assert first.first and first.announce and first.gap_s is None and not first.check_fence
    assert state.cached == 8 and state.first_token_at == 100.0
    assert state.due(100.0, urgent=False)
    one = state.record(100.0, epoch=3)
    state.sent(one.seq)
    second = state.took(_out("lo", (2,)), 100.05)
    assert not second.first and not second.announce and abs(second.gap_s - 0.05) < 1e-9  # type: ignore[operator]
    two = state.record(100.05, epoch=3)
    state.sent(two.seq)
    assert [(one.seq, one.text, one.token_ids, one.epoch), (two.seq, two.text, two.token_ids)] == [
        (0, "Hel", [1], 3), (1, "lo", [2])]
    assert state.reply == "Hello" and state.last_seq == 1 and state.shown == 1
    assert state.usage().prompt_tokens == 12 and state.usage().completion_tokens == 2
    assert state.usage().cached_prompt_tokens == 8


def test_outputs_inside_the_flush_window_share_a_record_and_a_finish_goes_at_once() -> None:
    state = _fresh(FlushPolicy(window_s=0.1, max_tokens=16))
    state.took(_out("a", (1,)), 0.0)
    state.record(0.0, 0)  # the first output goes at once
    state.took(_out("b", (2,)), 0.02)
    assert not state.due(0.02, urgent=False)
    state.took(_out("c", (3,), finished=True), 0.04)
    assert state.due(0.04, urgent=True)
    step = state.record(0.04, 0)
    assert (step.seq, step.text, step.token_ids) == (1, "bc", [2, 3]) and not state.gathered


def test_a_long_gap_asks_for_the_fence() -> None:
    state = _fresh()
    state.took(_out("a", (1,)), 10.0)
    assert state.took(_out("b", (2,)), 10.0 + FENCE_CHECK_GAP_S + 0.5).check_fence
    assert not state.took(_out("c", (3,)), 10.0 + FENCE_CHECK_GAP_S + 0.6).check_fence


def test_a_resumed_reply_continues_its_saved_sequence_and_text() -> None:
    started = GenerationStarted(generation_id="g", conversation_id="c", user_id="u", message_id="m", model="x",
                                pool="large", worker_id="w0", first_token_at=50.0, prompt_tokens=12)
    saved = Saved(started=started, chunks={
        0: TokensAppended(generation_id="g", conversation_id="c", seq=0, text="Once ", token_ids=[7, 8]),
        1: TokensAppended(generation_id="g", conversation_id="c", seq=1, text="upon", token_ids=[9])})
    state = ReplyStream("g", "c", 12, Generate([1] * 15, 61, saved.next_seq, True, 0), saved, PER_STEP)
    took = state.took(_out(" a time", (10, 11)), 60.0)
    assert took.first and not took.announce  # announced by the previous owner: its first token time stays
    assert state.first_token_at == 50.0
    assert state.record(60.0, 2).seq == 2
    assert state.reply == "Once upon a time" and state.usage().completion_tokens == 5


def test_text_held_back_and_never_checked_is_neither_shown_nor_saved() -> None:
    state = _fresh()
    for i, word in enumerate(("Fine ", "so ", "far")):
        state.took(_out(word, (i,)), float(i))
        step = state.record(float(i), 0)
        if i == 0:
            state.sent(step.seq)  # the rest is held back by the output check
    state.unshown("so far")
    assert state.reply == "Fine " and state.last_seq == 0


def test_a_retraction_ends_the_reply_with_its_notice_at_the_last_shown_record() -> None:
    state = _fresh()
    for i in range(3):
        state.took(_out("x", (i,)), float(i))
        state.sent(state.record(float(i), 0).seq)
    state.retracted("This reply was withdrawn.")
    # The finish names the last record shown: readers drop what came after it (the retraction says so).
    assert state.reply == "This reply was withdrawn." and state.last_seq == 2


def test_a_deleted_conversation_ends_empty() -> None:
    state = _fresh()
    state.took(_out("secret", (1,)), 0.0)
    state.emptied()
    assert state.reply == ""
