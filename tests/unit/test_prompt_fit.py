from consumers.prompt.fit import PER_MESSAGE_OVERHEAD, SYSTEM_PROMPT, Turn, fit


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
    assert fitted.turns_kept == 3  # two whole exchanges plus the question
    assert fitted.dropped_upto_turn == 2
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
    budget = words(SYSTEM_PROMPT) + PER_MESSAGE_OVERHEAD + 2 * (10 + PER_MESSAGE_OVERHEAD) + 40
    fitted = fit(_turns(8), words, budget, summary=(1, "old"))
    assert not fitted.summary_used


def test_current_turn_is_kept_even_when_over_budget() -> None:
    fitted = fit([Turn(0, "x " * 500, None)], words, 10)
    assert fitted.turns_kept == 1


def test_client_history_keeps_its_system_message_instead_of_parleys_and_newest_turns() -> None:
    from consumers.prompt.fit import fit_history

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
