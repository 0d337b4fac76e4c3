"""The prompt build stage against the real Cassandra and the model's own tokenizer: the user message is saved
before the prompt goes out, redeliveries are idempotent, and a retry that only the durable
client_message_id claim catches leaves nothing behind."""
from __future__ import annotations

from typing import Any

import pytest

from consumers.prompt.builder import PromptBuilder
from consumers.prompt.tokenizer import tokenizer_for
from infra.config.plans import Plan
from infra.config.settings import Settings
from infra.local.model import ready_pool as load_pool
from infra.stores.conversations import Conversations, Message
from infra.stores.quota import Quota
from infra.stores.quota_outcomes import Reservation
from infra.stores.records import Records, Summary
from schemas import PromptBuilt, RequestAdmitted, RequestRefused, new_id
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


async def _long_history(db: Any, cid: str, turns: int) -> None:
    convs = Conversations(db)
    for t in range(turns):
        user = Message(cid, t, new_id(), "user", f"Turn {t}: " + "tell me about the harbour " * 20)
        await convs.save_message(user)
        await convs.save_message(Message(cid, t, new_id(), "assistant", "The harbour is calm today. " * 12,
                                         status="complete", parent_id=user.message_id))


async def test_a_long_history_fits_each_pool_window_and_asks_for_a_summary(db: Any, settings: Settings,
                                                                         redis_client: Any) -> None:
    tok = tokenizer_for(str(load_pool("large", settings).model_path))
    windows = {"large": 2048, "small": 1024}  # a smaller overflow pool: the request is fitted for it too
    builder = PromptBuilder(Conversations(db), Records(db), Topics(settings.topic_prefix), lambda _: tok, 6000,
                            windows.__getitem__, redis=redis_client)
    cid = new_id()
    await _long_history(db, cid, 30)  # about 6,000 tokens of history
    outs = await builder.handle(admitted(cid, "cm-long", "And what about the lighthouse?"))
    built = outs[0].event
    assert isinstance(built, PromptBuilt) and built.max_tokens == 64
    assert 2048 - 64 - 200 < len(built.prompt_token_ids) <= 2048 - 64  # the whole window, measured
    assert 0 < built.turns_kept < 31 and not built.summary_used  # no summary exists yet
    [small] = built.alternates
    assert small.pool == "small" and small.prompt_token_ids and len(small.prompt_token_ids) <= 1024 - 64
    summary = [o.event for o in outs[1:]]
    assert len(summary) == 1 and summary[0].purpose == "summary" and summary[0].pool == "small"
    assert summary[0].turn == 30 - built.turns_kept and len(summary[0].prompt_token_ids) <= 1024 - 160
    again = await builder.handle(admitted(cid, "cm-long-2", "One more?"))
    assert [type(o.event) for o in again] == [PromptBuilt]  # one summary in flight at a time

    await Records(db).save_summary(Summary(cid, summary[0].turn, "They discussed the calm harbour.", 8))
    used = (await builder.handle(admitted(cid, "cm-long-3", "And the boats?")))[0].event
    assert used.summary_used and "calm harbour" in tok._tok.decode(used.prompt_token_ids)


async def test_a_lone_message_too_long_is_refused_and_released(db: Any, settings: Settings,
                                                              redis_client: Any) -> None:
    tok = tokenizer_for(str(load_pool("large", settings).model_path))
    plans = {"paid": Plan("paid", 500_000, 40_000, 80_000, 2, 64, 30, "paid")}
    quota = Quota(redis_client, plans, scope=settings.topic_prefix)
    builder = PromptBuilder(Conversations(db), Records(db), Topics(settings.topic_prefix), lambda _: tok, 6000,
                            lambda _: 2048, quota=quota, redis=redis_client)
    req = admitted(new_id(), "cm-huge", "word " * 2_100)
    assert isinstance(await quota.reserve("u-huge-" + req.generation_id, "paid", req.generation_id, 800),
                      Reservation)
    outs = await builder.handle(req)
    assert [type(o.event) for o in outs] == [RequestRefused] and outs[0].event.status == 413
    snap = await quota.snapshot("u-huge-" + req.generation_id, "paid")
    assert (snap["reserved"], snap["running"], snap["used"]) == (0, 0, 0)
    assert await Conversations(db).all_messages(req.conversation_id) == []  # nothing saved for it
