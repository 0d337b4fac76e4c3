"""Owner epochs, reader side: recovery ignores what a fenced-off worker appended after a newer owner began."""
from __future__ import annotations

from consumers.generation.fencing import is_current
from consumers.generation.recovery import collect
from schemas import GenerationStarted, TokensAppended

IDS = {"generation_id": "g", "conversation_id": "c", "user_id": "u"}


def started(epoch: int) -> GenerationStarted:
    return GenerationStarted(**IDS, message_id="m", model="m", pool="large", worker_id=f"w{epoch}",
                             first_token_at=1.0, prompt_tokens=3, epoch=epoch)


def chunk(seq: int, text: str, epoch: int) -> TokensAppended:
    return TokensAppended(**IDS, seq=seq, text=text, token_ids=[seq], epoch=epoch)


def test_recovery_keeps_the_newest_owners_tokens_and_drops_the_fenced_off_ones() -> None:
    saved = collect([started(1), chunk(0, "a", 1), chunk(1, "b", 1), started(2), chunk(2, "c", 2),
                     chunk(3, "X", 1), chunk(3, "d", 2)], "g")
    assert saved.text == "abcd" and saved.token_ids == [0, 1, 2, 3] and saved.next_seq == 4
    assert saved.started is not None and saved.started.epoch == 1  # when it first started


def test_events_without_an_epoch_stay_current() -> None:
    assert is_current(chunk(0, "a", 0), 0) and is_current(chunk(0, "a", 2), 1) and not is_current(chunk(0, "a", 1), 2)
