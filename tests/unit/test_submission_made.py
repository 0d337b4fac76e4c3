"""A conversation the gateway made, listed, for one OpenAI call is taken off the list when the call is refused
or given up, and left listed when it is accepted."""
from __future__ import annotations

import asyncio
from typing import Any

import pytest

from producers.gateway import submission
from schemas import MessageSubmitted, RequestRefused
from tests.fake_stores import FakeConversations


class Gw:
    def __init__(self) -> None:
        self.conversations = FakeConversations()


def request(made_listed: bool) -> MessageSubmitted:
    return MessageSubmitted(generation_id="g", conversation_id="c", user_id="u", plan="free", message_id="m",
                            client_message_id="k", content="hi", fresh_conversation=True, made_listed=made_listed)


async def _settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


@pytest.mark.parametrize("made_listed", [True, False])
async def test_a_refused_call_takes_its_listed_conversation_off_the_list(monkeypatch: pytest.MonkeyPatch,
                                                                          made_listed: bool) -> None:
    async def refused(gw: Any, user: Any, req: MessageSubmitted) -> Any:
        raise submission.Refused(RequestRefused(generation_id=req.generation_id, conversation_id="c", user_id="u",
                                                reason="quota", status=429, message="over quota"))

    monkeypatch.setattr(submission, "submit", refused)
    gw = Gw()
    with pytest.raises(submission.Refused):
        await submission.submit_made(gw, None, request(made_listed))  # type: ignore[arg-type]
    await _settle()
    assert gw.conversations.taken_off == (["c"] if made_listed else [])


async def test_a_client_leaving_during_the_decision_still_takes_it_off(monkeypatch: pytest.MonkeyPatch) -> None:
    async def slow(gw: Any, user: Any, req: MessageSubmitted) -> Any:
        await asyncio.sleep(10)

    monkeypatch.setattr(submission, "submit", slow)
    gw = Gw()
    task = asyncio.ensure_future(submission.submit_made(gw, None, request(True)))  # type: ignore[arg-type]
    await _settle()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await _settle()
    assert gw.conversations.taken_off == ["c"]


async def test_an_accepted_call_stays_listed(monkeypatch: pytest.MonkeyPatch) -> None:
    async def accepted(gw: Any, user: Any, req: MessageSubmitted) -> Any:
        return "accepted"

    monkeypatch.setattr(submission, "submit", accepted)
    gw = Gw()
    assert await submission.submit_made(gw, None, request(True)) == "accepted"  # type: ignore[arg-type]
    await _settle()
    assert gw.conversations.taken_off == []
