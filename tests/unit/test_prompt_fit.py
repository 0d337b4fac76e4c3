from consumers.prompt.fit import (
    DROP_STEP,
    MIN_REPLY_TOKENS,
    PER_MESSAGE_OVERHEAD,
    SUMMARY_MAX_GAP,
    SYSTEM_PROMPT,
    TooLong,
    Turn,
    Window,
    fit,
    fit_history,
    fit_window,
    instructions_note,
)
from consumers.prompt.summary import ahead, summary_messages, wanted
from infra.stores.records import Summary


def words(text: str) -> int:
    return len(text.split())


def _turns(n: int, size: int = 10) -> list[Turn]:
    out = [Turn(i, " ".join(["u"] * size), " ".join(["a"] * size)) for i in range(n - 1)]
    return out + [Turn(n - 1, "now?", None)]


def test_everything_fits_under_a_big_budget() -> None:
    fitted = fit(_turns(3), words, 10_000)
    assert fitted.turns_kept == 3 and fitted.dropped_upto_turn is None
    assert fitted.messages[0] == {"role": "system", "content": SYSTEM_PROMPT}
    assert [m["role"] for m in fitted.messages[1:]] == ["user", "assistant", "user", "assistant", "user"]


def test_oldest_turns_fall_out_first_and_the_budget_holds() -> None:
    budget = words(SYSTEM_PROMPT) + PER_MESSAGE_OVERHEAD + 2 * (2 * (10 + PER_MESSAGE_OVERHEAD)) + 10
    fitted = fit(_turns(6), words, budget)
    # Two whole exchanges plus the question would fit (turns 3-5); turns fall out in blocks of DROP_STEP,
    # so the oldest kept turn is 4.
    assert fitted.turns_kept == 2
    assert fitted.dropped_upto_turn == 3
    total = sum(words(m["content"]) + PER_MESSAGE_OVERHEAD for m in fitted.messages)
    assert total <= budget


def test_summary_of_dropped_turns_follows_the_shared_system_prompt() -> None:
    # room for the question, one exchange and a short note, not for a second exchange
    budget = words(SYSTEM_PROMPT) + PER_MESSAGE_OVERHEAD + 6 + 2 * (10 + PER_MESSAGE_OVERHEAD) + 20
    fitted = fit(_turns(6), words, budget, summary=(3, "they talked about cats"))
    assert fitted.turns_kept == 2
    assert fitted.summary_used
    assert fitted.messages[0]["content"] == SYSTEM_PROMPT  # the shared prefix is untouched
    assert "cats" in fitted.messages[1]["content"] and fitted.messages[1]["role"] == "system"


def test_stale_summary_is_not_used() -> None:
    budget = words(SYSTEM_PROMPT) + PER_MESSAGE_OVERHEAD + 2 * (10 + PER_MESSAGE_OVERHEAD) + 40 + 20
    fitted = fit(_turns(14), words, budget, summary=(1, "old"))
    assert fitted.dropped_upto_turn is not None and fitted.dropped_upto_turn - 1 > SUMMARY_MAX_GAP
    assert not fitted.summary_used
    recent = fit(_turns(14), words, budget, summary=(fitted.dropped_upto_turn - SUMMARY_MAX_GAP, "recent"))
    assert recent.summary_used  # a summary a few turns behind still stands in for what fell out


def test_current_turn_is_kept_even_when_over_budget() -> None:
    fitted = fit([Turn(0, "x " * 500, None)], words, 10)
    assert fitted.turns_kept == 1


def test_client_history_keeps_its_system_message_instead_of_parleys_and_newest_turns() -> None:
    history = [("system", "be terse"), ("user", "a " * 50), ("assistant", "b " * 50), ("user", "question?")]
    budget = 2 + 3 * PER_MESSAGE_OVERHEAD + 1 + 60
    fitted = fit_history(history, words, budget)
    roles = [m["role"] for m in fitted.messages]
    assert roles == ["system", "assistant", "user"]  # the oldest user turn fell out
    assert fitted.messages[0]["content"] == "be terse" and fitted.messages[-1]["content"] == "question?"
    assert all(m["content"] != SYSTEM_PROMPT for m in fitted.messages)


def test_client_history_without_a_system_message_gets_parleys() -> None:
    from consumers.prompt.fit import fit_history

    fitted = fit_history([("user", "hi")], words, 1000)
    assert fitted.messages == [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": "hi"}]


def render(messages: list[dict[str, str]]) -> list[int]:
    """A chat template that costs more than the estimate: 9 tokens around each message, 3 to start the reply."""
    return [0] * (sum(words(m["content"]) + 9 for m in messages) + 3)


def test_window_fits_the_rendered_prompt_under_the_pool_window_minus_the_reply_cap() -> None:
    turns = _turns(40, size=30)
    for context, cap in ((2048, 256), (1024, 256), (512, 48)):
        got = fit_window(lambda b: fit(turns, words, b), render, 6000, context, cap)
        assert isinstance(got, Window) and got.max_tokens == cap
        assert len(got.ids) <= context - cap  # measured with the template, not the per-message guess
        assert len(got.ids) + DROP_STEP * 2 * (30 + 9) > context - cap  # not much shorter than it could be
        assert got.fitted.dropped_upto_turn is not None


def test_window_respects_a_budget_smaller_than_the_window() -> None:
    got = fit_window(lambda b: fit(_turns(40, size=30), words, b), render, 500, 2048, 256)
    assert isinstance(got, Window) and len(got.ids) <= 500


def test_a_long_lone_message_shortens_the_reply_and_one_too_long_is_refused() -> None:
    def alone(n: int):  # type: ignore[no-untyped-def]
        return lambda b: fit([Turn(0, "w " * 20, "r " * 20), Turn(1, "x " * n, None)], words, b)
    fixed = len(render(fit([Turn(0, "", None)], words, 0).messages))
    roomy = fit_window(alone(2048 - fixed - 256 - 10), render, 6000, 2048, 256)
    assert isinstance(roomy, Window) and roomy.max_tokens == 256 and roomy.fitted.turns_kept == 1
    squeezed = fit_window(alone(2048 - fixed - 100), render, 6000, 2048, 256)
    assert isinstance(squeezed, Window) and squeezed.max_tokens == 100 and len(squeezed.ids) + 100 == 2048
    refused = fit_window(alone(2048 - fixed - MIN_REPLY_TOKENS + 1), render, 6000, 2048, 256)
    assert isinstance(refused, TooLong) and refused.tokens > refused.most == 2048 - MIN_REPLY_TOKENS


def test_client_history_keeps_the_newest_turns_that_fit_the_window() -> None:
    history = [("system", "be terse")] + [(r, f"{r} " * 50) for _ in range(30) for r in ("user", "assistant")]
    history.append(("user", "question?"))
    got = fit_window(lambda b: fit_history(history, words, b), render, 6000, 1024, 128)
    assert isinstance(got, Window) and len(got.ids) <= 1024 - 128
    assert got.fitted.messages[0]["content"] == "be terse" and got.fitted.messages[-1]["content"] == "question?"
    assert 10 < got.fitted.turns_kept < 61


def test_summaries_roll_forward_from_the_previous_one() -> None:
    assert not wanted(None, None) and wanted(3, None)
    assert not wanted(5, Summary("c", 4, "s", 1)) and wanted(6, Summary("c", 4, "s", 1))
    turns = _turns(10)
    messages = summary_messages(turns, 7, Summary("c", 4, "cats were named", 3), words, 10_000)
    body = messages[1]["content"]
    assert body.startswith("Summary so far: cats were named")
    assert body.count("User:") == 3  # turns 5, 6 and 7: the previous summary covers the rest
    short = summary_messages(turns, 7, None, words, 60)
    assert 1 <= short[1]["content"].count("User:") < 8 and words(short[1]["content"]) <= 60


def test_the_oldest_kept_turn_stays_put_for_several_prompts() -> None:
    """So the engine's prefix cache serves the start of the next prompts instead of prefilling it again."""
    budget = 600
    firsts = []
    for n in range(20, 40):
        fitted = fit(_turns(n, size=30), words, budget)
        firsts.append(fitted.dropped_upto_turn)  # the oldest kept turn is the one after it
        assert sum(words(m["content"]) + PER_MESSAGE_OVERHEAD for m in fitted.messages) <= budget
    changes = sum(1 for a, b in zip(firsts, firsts[1:], strict=False) if a != b)
    assert None not in firsts and changes <= len(firsts) // DROP_STEP + 1  # once a block, not once a turn
    assert all((d + 1) % DROP_STEP == 0 for d in firsts)  # type: ignore[operator]


def test_custom_instructions_follow_the_shared_prompt_before_the_summary_and_count_in_the_budget() -> None:
    told = "Answer in French. Keep it short."
    budget = words(SYSTEM_PROMPT) + PER_MESSAGE_OVERHEAD + 6 + 2 * (10 + PER_MESSAGE_OVERHEAD) + 20
    plain = fit(_turns(14), words, budget, summary=(11, "they talked about cats"))
    cost = words(instructions_note(told) or "") + PER_MESSAGE_OVERHEAD
    with_told = fit(_turns(14), words, budget + cost, summary=(11, "they talked about cats"), instructions=told)
    # The shared prompt stays first (one prefix for every user), the instructions next, then the summary.
    assert with_told.messages[0] == {"role": "system", "content": SYSTEM_PROMPT}
    assert with_told.messages[1]["role"] == "system" and with_told.messages[1]["content"].endswith(told)
    assert with_told.messages[2]["content"].startswith("Summary of the earlier conversation")
    assert with_told.messages[3:] == plain.messages[2:]  # the same turns fit once the budget grows by their cost
    squeezed = fit(_turns(14), words, budget, summary=(11, "they talked about cats"), instructions=told)
    assert squeezed.turns_kept < plain.turns_kept  # they took room from the turns
    total = sum(words(m["content"]) + PER_MESSAGE_OVERHEAD for m in squeezed.messages)
    assert total <= budget


def test_custom_instructions_are_the_same_tokens_on_every_turn() -> None:
    told = "Call me Sam."
    prompts = [fit(_turns(n), words, 10_000, instructions=told).messages for n in (1, 3, 7)]
    assert prompts[0][:2] == prompts[1][:2] == prompts[2][:2]  # a stable prefix: the engine's cache holds it
    assert fit(_turns(3), words, 10_000, instructions="").messages == fit(_turns(3), words, 10_000).messages


def test_the_block_that_falls_next_is_summarised_before_it_falls() -> None:
    turns = _turns(20)  # turns 0-18 answered, 19 asked now
    assert ahead(turns, 12, newest=7) == 11  # kept from 8: turns 8-11 fall next
    assert ahead(turns, 10, newest=7) == 11  # kept from 10: the block ends at 11 all the same
    assert ahead(turns, 12, newest=None) == 11
    assert ahead(turns, 12, newest=11) is None  # written already (or asked for: the slot says)
    # A block that reaches the turn being answered is not summarised (its reply does not exist yet).
    assert ahead(turns, 2, newest=7) is None
    assert ahead(turns, 1, newest=7) is None


def test_a_summary_written_ahead_waits_for_its_block_to_fall_and_the_prompt_start_holds_till_then() -> None:
    budget = 230
    now = fit(_turns(20), words, budget, summary=(11, "up to eleven"))
    assert now.summary_used and now.dropped_upto_turn is not None
    fallen = now.dropped_upto_turn
    # The block after it is summarised ahead (it is still kept): the older summary, which covers what fell,
    # stands in, so the prompt starts as it did before the ahead one was written.
    ahead_one = (fallen + DROP_STEP, "up to the next block")
    same = fit(_turns(20), words, budget, summary=ahead_one, older=(fallen, "up to what fell"))
    before = fit(_turns(20), words, budget, summary=(fallen, "up to what fell"))
    assert same.messages[:3] == before.messages[:3] and same.dropped_upto_turn == fallen
    # Once that block has fallen (the conversation grew by a block), the ahead one stands in.
    later = fit(_turns(20 + DROP_STEP), words, budget, summary=ahead_one, older=(fallen, "up to what fell"))
    assert later.dropped_upto_turn == fallen + DROP_STEP
    assert later.messages[1]["content"].endswith("up to the next block")
    # No older one, or one too far behind: the newest stands in, as before.
    alone = fit(_turns(20), words, budget, summary=ahead_one)
    assert alone.summary_used and alone.messages[1]["content"].endswith("up to the next block")
