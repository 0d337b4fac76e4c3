"""The prompt build stage against the real Cassandra and the model's own tokenizer: the user message is saved
before the prompt goes out, redeliveries are idempotent, and a retry that only the durable
client_message_id claim catches leaves nothing behind."""
from __future__ import annotations

from typing import Any

import pytest

from consumers.prompt.builder import PromptBuilder
from consumers.prompt.tokenizer import tokenizer_for
from infra.config.settings import Settings
from infra.local.model import ready_pool as load_pool
from infra.stores.conversations import Conversations
from infra.stores.records import Records
from schemas import PromptBuilt, RequestAdmitted, new_id
from topics import Topics


@pytest.fixture
def builder(db: Any, settings: Settings) -> PromptBuilder:
    model = load_pool("large", settings).model_path
    if not model.exists():
        pytest.fail(f"model folder {model} missing: run `infra/parley test` (it prepares the model)")
    tok = tokenizer_for(str(model))
    return PromptBuilder(Conversations(db), Records(db), Topics(settings.topic_prefix), lambda _: tok, 6000,
                         lambda _: 2048)


def admitted(cid: str, cmid: str, content: str = "Name a colour.", **extra: Any) -> RequestAdmitted:
    return RequestAdmitted(generation_id=new_id(), conversation_id=cid, user_id="u1", plan="paid",
                           message_id=new_id(), client_message_id=cmid, content=content, pool="large",
                           reply_cap=64, reserved_tokens=100, **extra)


async def test_saves_then_builds_and_a_redelivery_changes_nothing(builder: PromptBuilder, db: Any) -> None:
    cid = new_id()
    req = admitted(cid, "cm-1")
    outs = await builder.handle(req)
    assert len(outs) == 1 and isinstance(outs[0].event, PromptBuilt)
    built = outs[0].event
    assert built.turn == 0 and built.prompt_token_ids and built.max_tokens == 64
    saved = await Conversations(db).all_messages(cid)
    assert {(m.role, m.turn, m.status) for m in saved} == {("user", 0, "complete"), ("assistant", 0, "generating")}
    assert next(m for m in saved if m.role == "user").content == "Name a colour."

    again = await builder.handle(req)  # the same record delivered twice (a crash before the commit)
    assert len(again) == 1 and again[0].event.turn == 0
    assert again[0].event.prompt_token_ids == built.prompt_token_ids
    assert len(await Conversations(db).all_messages(cid)) == 2


async def test_a_retry_the_gateway_missed_joins_nothing_and_leaves_no_rows(builder: PromptBuilder,
                                                                            db: Any) -> None:
    cid = new_id()
    first = admitted(cid, "cm-dup")
    assert await builder.handle(first)
    retry = admitted(cid, "cm-dup")  # same client_message_id, new generation: Redis forgot the first claim
    assert await builder.handle(retry) == []
    saved = await Conversations(db).all_messages(cid)
    assert {m.message_id for m in saved} == {first.message_id, first.generation_id}


async def test_a_redelivery_after_a_later_message_keeps_its_turn(builder: PromptBuilder, db: Any) -> None:
    cid = new_id()
    first = admitted(cid, "cm-a", "First question.")
    await builder.handle(first)
    second = admitted(cid, "cm-b", "Second question.")
    assert (await builder.handle(second))[0].event.turn == 1
    replayed = await builder.handle(first)  # redelivered after turn 1 exists: still turn 0
    assert replayed[0].event.turn == 0
    saved = await Conversations(db).all_messages(cid)
    users = sorted((m.turn, m.content) for m in saved if m.role == "user")
    assert users == [(0, "First question."), (1, "Second question.")]
    assert sorted((m.turn, m.message_id) for m in saved if m.role == "assistant") == \
        sorted([(0, first.generation_id), (1, second.generation_id)])
