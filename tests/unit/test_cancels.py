"""The cancels a worker hears: each aborts its sequence at once, is remembered for a request picked up later,
and is forgotten past the memory window; anything else on the control topic is ignored."""
from __future__ import annotations

from consumers.generation.cancels import Cancels
from schemas import CancelRequested, encode


class Aborts:
    def __init__(self) -> None:
        self.ids: list[str] = []

    async def __call__(self, generation_id: str) -> None:
        self.ids.append(generation_id)


def cancel(gid: str) -> bytes:
    return encode(CancelRequested(generation_id=gid, conversation_id="c", user_id="u"))


async def test_a_cancel_aborts_its_sequence_and_is_remembered() -> None:
    aborts = Aborts()
    cancels = Cancels(aborts, memory_s=60)
    await cancels.on_record(cancel("g1"), now=1_000.0)
    assert aborts.ids == ["g1"]
    assert "g1" in cancels and "g2" not in cancels


async def test_cancels_older_than_the_memory_are_forgotten() -> None:
    cancels = Cancels(Aborts(), memory_s=60)
    await cancels.on_record(cancel("old"), now=1_000.0)
    await cancels.on_record(cancel("new"), now=1_061.0)
    assert "old" not in cancels and "new" in cancels


async def test_what_is_not_a_cancel_is_ignored() -> None:
    aborts = Aborts()
    cancels = Cancels(aborts)
    await cancels.on_record(b"not an event")
    await cancels.on_record(b'{"type":"SomethingElse"}')
    assert aborts.ids == [] and not cancels.heard
