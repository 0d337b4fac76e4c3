from consumers.scheduler.canned import CannedReplies, normalise


def test_matching_ignores_case_spacing_and_trailing_punctuation() -> None:
    canned = CannedReplies({"What can you do": "lots"})
    assert canned.reply_for("  what   CAN you do?! ") == "lots"
    assert canned.reply_for("what can you not do") is None


def test_default_table_loads_and_answers_a_greeting() -> None:
    canned = CannedReplies.load()
    assert canned.reply_for("Hello!") and normalise("Hi .") == "hi"
