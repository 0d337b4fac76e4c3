"""The read-your-writes overlay, what a reply is charged (a failed one too), and the billing check of
charges against replies."""
from __future__ import annotations

from infra.stores.conversations import Message
from infra.stores.finished import overlay
from infra.stores.settling import charge_for
from schemas import GenerationFinished, Usage, UsageRecorded
from streams.billing import unmatched_charges


def _finished(gid: str, status: str = "complete", text: str = "Paris.") -> GenerationFinished:
    return GenerationFinished(generation_id=gid, conversation_id="c", user_id="u", plan="free", message_id=gid,
                              status=status, text=text, model="m", pool="large", worker_id="w",  # type: ignore[arg-type]
                              usage=Usage(prompt_tokens=30, completion_tokens=4, cached_prompt_tokens=16))


def _usage(gid: str, charged: int) -> UsageRecorded:
    return UsageRecorded(generation_id=gid, conversation_id="c", user_id="u", plan="free", model="m", pool="large",
                         status="complete", day="2026-12-01", tokens_in=charged, tokens_out=0, tokens_cached=0,
                         reserved_tokens=600, charged_tokens=charged)


def test_an_ended_reply_shows_final_over_its_generating_row() -> None:
    rows = [Message("c", 0, "um", "user", "Capital of France?"),
            Message("c", 0, "g1", "assistant", "", status="generating", generation_id="g1"),
            Message("c", 1, "g2", "assistant", "", status="generating", generation_id="g2")]
    shown = overlay(rows, {"g1": _finished("g1")})
    assert shown[0] == rows[0] and shown[2] == rows[2]  # the user row and a reply still being written: as saved
    assert (shown[1].status, shown[1].content, shown[1].tokens_in, shown[1].tokens_out, shown[1].model) == (
        "complete", "Paris.", 30, 4, "m")
    assert shown[1].finished_at is not None


def test_a_retracted_reply_shows_its_block_before_it_is_saved() -> None:
    import msgspec

    from schemas import Block

    block = Block(check="output", category="astronomy", score=1.0, rules_version="r-7")
    ended = msgspec.structs.replace(_finished("g1", status="blocked", text="Removed."), block=block)
    row = Message("c", 0, "g1", "assistant", "", status="generating", generation_id="g1")
    (shown,) = overlay([row], {"g1": ended})
    assert (shown.status, shown.content, shown.block_category, shown.rules_version) == (
        "blocked", "Removed.", "astronomy", "r-7")


def test_a_saved_row_wins_over_the_overlay() -> None:
    saved = Message("c", 0, "g1", "assistant", "Paris.", status="complete", generation_id="g1", tokens_out=4)
    assert overlay([saved], {"g1": _finished("g1", text="other")}) == [saved]


def test_a_reply_is_charged_what_the_engine_read_and_wrote_even_when_it_failed() -> None:
    import msgspec

    assert charge_for(_finished("g", "stopped")) == (30, 4) == charge_for(_finished("g", "length"))
    assert charge_for(_finished("g", "failed")) == (30, 4)  # failed in the engine: it burned engine time
    never_ran = msgspec.structs.replace(_finished("g", "failed"), usage=Usage())  # refused before any engine
    assert charge_for(never_ran) == (0, 0)


def test_billing_names_a_charge_with_no_reply_or_another_amount() -> None:
    charges = {"ok": _usage("ok", 34), "ghost": _usage("ghost", 9_334), "over": _usage("over", 40),
               "failed": _usage("failed", 34)}
    replies = {"ok": _finished("ok"), "over": _finished("over"), "failed": _finished("failed", "failed")}
    found = {(m.generation_id, m.field, m.expected, m.found) for m in unmatched_charges(charges, replies)}
    assert found == {("ghost", "charged, no reply", 0, 9_334), ("over", "charged", 34, 40)}
