"""Repository round trips against the real Cassandra, in the test run's keyspace."""
from __future__ import annotations

import asyncio
import dataclasses
from datetime import UTC, datetime, timedelta

from infra.config.settings import Settings
from infra.stores.accounts import Accounts, hash_token
from infra.stores.conversations import Conversations, Message
from infra.stores.cql.migrate import apply
from infra.stores.records import Records, Summary, UsageDay
from schemas import new_id


async def test_user_and_token_round_trip(db) -> None:  # type: ignore[no-untyped-def]
    accounts = Accounts(db)
    user, token = await accounts.create_user("paid", "Ada")
    found = await accounts.user_for_token(token)
    assert found == user and found.plan == "paid"
    assert await accounts.user_for_token(token + "x") is None
    rows = await db.execute("SELECT token_hash FROM api_tokens WHERE token_hash = ?", (hash_token(token),))
    assert rows and rows[0].token_hash != token  # stored hashed, never in clear


async def test_conversations_list_newest_first_with_cursor(db) -> None:  # type: ignore[no-untyped-def]
    convs = Conversations(db)
    user = new_id()
    made = [await convs.create(user) for _ in range(5)]
    # touch the oldest: it must move to the top, and appear once
    top = await convs.touch(made[0], datetime.now(UTC) + timedelta(seconds=5), title="First")
    page1, cursor = await convs.list_for_user(user, limit=3)
    assert [c.conversation_id for c in page1][0] == top.conversation_id and page1[0].title == "First"
    page2, _ = await convs.list_for_user(user, cursor=cursor, limit=3)
    listed = [c.conversation_id for c in page1 + page2]
    assert sorted(listed) == sorted(c.conversation_id for c in made) and len(set(listed)) == 5
    assert [c.updated_at for c in page1 + page2] == sorted((c.updated_at for c in page1 + page2), reverse=True)


async def test_a_reply_saved_after_its_conversation_was_deleted_does_not_list_it_again(db) -> None:  # type: ignore[no-untyped-def]
    """Persistence read the conversation, its owner deleted everything, then the reply's touch moved it to the top
    of the list: the list skips the row (its conversation is deleted) and the purge removes it."""
    convs = Conversations(db)
    user = new_id()
    conv = await convs.create(user, title="gone soon")
    kept = await convs.create(user, title="kept")
    await convs.mark_deleted(conv)  # hidden, and its list rows removed (as delete-all does)
    await convs.touch(conv, datetime.now(UTC) + timedelta(seconds=5))  # the late reply's bump
    listed, _ = await convs.list_for_user(user, limit=10, source=None)
    assert [c.conversation_id for c in listed] == [kept.conversation_id]
    assert await convs.get(conv.conversation_id) is None
    assert await convs.unlist(user, conv.conversation_id) == 1  # the purge's unlist finds the bump's row
    assert await convs.unlist(user, conv.conversation_id) == 0


async def test_a_list_read_between_a_late_bump_and_its_take_back_does_not_show_the_deleted(db) -> None:  # type: ignore[no-untyped-def]
    """The late reply's touch writes its list row before it sees the deletion; a list read in that window (the
    sidebar reloaded right after delete-all) must not show the conversation."""
    convs = Conversations(db)
    user = new_id()
    conv = await convs.create(user, title="gone soon")
    kept = await convs.create(user, title="kept")
    await convs.mark_deleted(conv)
    await db.execute(  # the row the bump writes first, as it stands before its check takes it back
        "INSERT INTO conversations_by_user (user_id, updated_at, conversation_id, title, model, source) "
        "VALUES (?, ?, ?, ?, ?, ?)", (user, datetime.now(UTC) + timedelta(seconds=5), conv.conversation_id, None,
                                      None, "page"))
    listed, _ = await convs.list_for_user(user, limit=1, source=None)  # the page fills from the next row
    assert [c.conversation_id for c in listed] == [kept.conversation_id]
    other = await convs.create(new_id(), title="someone else's")
    await db.execute(
        "INSERT INTO conversations_by_user (user_id, updated_at, conversation_id, title, model, source) "
        "VALUES (?, ?, ?, ?, ?, ?)", (user, datetime.now(UTC) + timedelta(seconds=6), other.conversation_id, None,
                                      None, "page"))
    assert [c.conversation_id for c in (await convs.list_for_user(user, limit=10))[0]] == [kept.conversation_id]


async def test_api_conversations_are_listed_only_when_asked_for(db) -> None:  # type: ignore[no-untyped-def]
    convs = Conversations(db)
    user = new_id()
    page = await convs.create(user, title="page")
    api = [await convs.create(user, title=f"api {i}", source="api") for i in range(4)]  # newer than the page one
    touched = await convs.touch(api[0], datetime.now(UTC) + timedelta(seconds=5))
    assert touched.source == "api" and (await convs.get(api[0].conversation_id)).source == "api"  # type: ignore[union-attr]
    sidebar, cursor = await convs.list_for_user(user, limit=2)  # reads past the api rows to fill the page
    assert [c.conversation_id for c in sidebar] == [page.conversation_id] and cursor is None
    listed, _ = await convs.list_for_user(user, limit=10, source="api")
    assert {c.conversation_id for c in listed} == {c.conversation_id for c in api} and len(listed) == 4
    assert len((await convs.list_for_user(user, limit=10, source=None))[0]) == 5
    await convs.mark_deleted(touched)
    assert await convs.get(touched.conversation_id) is None
    assert len((await convs.list_for_user(user, limit=10, source="api"))[0]) == 3
    # Made unlisted (as the OpenAI endpoints make theirs): its first reply writes its one list row, where it was
    # made, with its title; a later touch moves it up and leaves no second row.
    unlisted = await convs.create(user, title="api call", source="api", listed=False)
    assert unlisted.conversation_id not in {c.conversation_id for c in (await convs.list_for_user(
        user, limit=10, source="api"))[0]}
    await convs.list_where_made(unlisted)
    [first] = (await convs.list_for_user(user, limit=1, source="api"))[0]
    assert (first.conversation_id, first.title) == (unlisted.conversation_id, "api call")
    assert first.updated_at == (await convs.get(unlisted.conversation_id)).updated_at  # type: ignore[union-attr]
    await convs.touch(unlisted, datetime.now(UTC) + timedelta(seconds=6))
    assert await convs.unlist(user, unlisted.conversation_id) == 1


async def test_a_conversation_listed_as_made_is_its_owners_without_an_index_row_and_taken_off_the_list_with_one(
        db) -> None:  # type: ignore[no-untyped-def]
    convs = Conversations(db)
    user = new_id()
    made = await convs.create(user, title="api call", source="api", listed=True)  # as an OpenAI call's
    owned = await db.execute("SELECT conversation_id FROM conversations_of_user WHERE user_id = ?", (user,))
    assert list(owned) == []  # found by its list row: delete-all and export read both
    assert await convs.ids_of_user(user) == [made.conversation_id]
    [listed] = (await convs.list_for_user(user, limit=10, source="api"))[0]
    assert listed.updated_at.replace(tzinfo=UTC) == made.updated_at  # made at its id's time: the row's key
    await convs.take_off_list(user, made.conversation_id)  # refused, or its reply had no text
    assert (await convs.list_for_user(user, limit=10, source="api"))[0] == []
    assert await convs.ids_of_user(user) == [made.conversation_id]  # still its owner's, for delete-all
    unlisted = await convs.create(user, source="api", listed=False)
    assert sorted(await convs.ids_of_user(user)) == sorted([made.conversation_id, unlisted.conversation_id])


async def test_messages_with_siblings_and_overwrite_on_retry(db) -> None:  # type: ignore[no-untyped-def]
    convs = Conversations(db)
    conv = await convs.create(new_id())
    cid = conv.conversation_id
    user_msg = Message(cid, 0, new_id(), "user", "hi", tokens_in=3)
    first = Message(cid, 0, new_id(), "assistant", "hel", status="streaming", parent_id=user_msg.message_id)
    await convs.save_message(user_msg)
    await convs.save_message(first)
    await convs.save_message(Message(cid, 0, first.message_id, "assistant", "hello", status="complete",
                                     tokens_out=2, parent_id=user_msg.message_id, model="m"))
    sibling = Message(cid, 0, new_id(), "assistant", "hey", status="complete", parent_id=user_msg.message_id)
    await convs.save_message(sibling)
    messages = await convs.all_messages(cid)
    assert [m.role for m in messages] == ["user", "assistant", "assistant"]
    assert messages[1].content == "hello" and messages[1].status == "complete"  # overwritten, not duplicated
    assert {m.parent_id for m in messages[1:]} == {user_msg.message_id}


async def test_a_placeholder_written_as_of_its_id_never_overwrites_the_saved_reply(db) -> None:  # type: ignore[no-untyped-def]
    """A first message's prompt build reads no history, so a redelivery cannot see that its reply was saved: its
    placeholder, written as of the reply id's time in the same batch as the user message, loses to the reply's
    row, written later, while the user message is rewritten as usual."""
    convs = Conversations(db)
    cid = (await convs.create(new_id(), listed=False)).conversation_id
    user_msg = Message(cid, 0, new_id(), "user", "hi")
    placeholder = Message(cid, 0, new_id(), "assistant", "", status="generating", parent_id=user_msg.message_id)
    await convs.save_messages([user_msg, placeholder], placeholder_at_id_time=True)
    assert [m.status for m in await convs.all_messages(cid)] == ["complete", "generating"]
    await convs.save_message(dataclasses.replace(placeholder, content="hello", status="complete"))  # the reply
    await convs.save_messages([dataclasses.replace(user_msg, content="hi again"), placeholder],
                              placeholder_at_id_time=True)  # the record applied again
    messages = await convs.all_messages(cid)
    assert [(m.content, m.status) for m in messages] == [("hi again", "complete"), ("hello", "complete")]


async def test_client_message_claim_is_first_wins(db) -> None:  # type: ignore[no-untyped-def]
    convs = Conversations(db)
    cid = new_id()
    first = await convs.claim_client_message(cid, "cm-1", "gen-a", "msg-a", 0)
    second = await convs.claim_client_message(cid, "cm-1", "gen-b", "msg-b", 1)
    assert first.created and not second.created
    assert (second.generation_id, second.message_id, second.turn) == ("gen-a", "msg-a", 0)


async def test_usage_and_summary_round_trip(db) -> None:  # type: ignore[no-untyped-def]
    records = Records(db)
    user = new_id()
    await records.put_usage_day(UsageDay(user, "2026-11-29", 10, 20, 5, 1))
    await records.put_usage_day(UsageDay(user, "2026-11-29", 15, 30, 5, 2))  # absolute values: overwrite
    assert await records.usage_day(user, "2026-11-29") == UsageDay(user, "2026-11-29", 15, 30, 5, 2)
    cid = new_id()
    await records.save_summary(Summary(cid, 3, "older turns", 4))
    await records.save_summary(Summary(cid, 7, "more turns", 6))
    assert (await records.latest_summary(cid)).upto_turn == 7  # type: ignore[union-attr]
    # The newest two, newest first (the prompt build picks one written ahead only once its turns fell out).
    assert [(s.upto_turn, s.summary) for s in await records.latest_summaries(cid)] == [(7, "more turns"),
                                                                                      (3, "older turns")]


async def test_usage_is_counted_once_per_generation_from_the_ledger(db) -> None:  # type: ignore[no-untyped-def]
    """The rollup's day totals come from Cassandra's ledger, never from what the rollup held in memory: a
    record counted twice is one reply, and a day row written wrong (a crashed rollup's stale state) is
    rewritten right by the next record."""
    records, user, day = Records(db), new_id(), "2026-11-30"
    first, new_a = await records.count_usage(user, day, "gen-a", 50, 10, 0)
    again, new_again = await records.count_usage(user, day, "gen-a", 50, 10, 0)  # redelivered
    assert new_a and not new_again and first == again == UsageDay(user, day, 50, 10, 0, 1)
    await records.put_usage_day(UsageDay(user, day, 0, 0, 0, 0))  # a stale writer's row
    second, new_b = await records.count_usage(user, day, "gen-b", 7, 3, 2)
    assert new_b and second == UsageDay(user, day, 57, 13, 2, 2)
    assert await records.usage_day(user, day) == second


class _Counting:
    """The session, counting what is read and what is compare-and-set."""

    def __init__(self, db) -> None:  # type: ignore[no-untyped-def]
        self.db, self.reads, self.batches = db, 0, 0

    async def execute(self, cql: str, params=()):  # type: ignore[no-untyped-def]
        self.reads += cql.lstrip().upper().startswith("SELECT")
        return await self.db.execute(cql, params)

    async def atomically(self, statements):  # type: ignore[no-untyped-def]
        self.batches += 1
        return await self.db.atomically(statements)


async def test_a_new_day_is_counted_with_no_read_and_a_refused_batch_gives_the_totals(db) -> None:  # type: ignore[no-untyped-def]
    """A day from TOTALS_SINCE on is tried as new: its first count is one batch and no read. A process that has
    not counted a day with totals (restarted) is refused once and goes on from the totals the refusal gives; a
    redelivery there is answered from it too. No read either way, and the totals stay exact."""
    user, day = new_id(), "2026-12-06"
    first = _Counting(db)
    assert await Records(first).count_usage(user, day, "gen-a", 50, 10, 0) == (UsageDay(user, day, 50, 10, 0, 1),
                                                                               True)
    assert (first.reads, first.batches) == (0, 1)
    restarted = _Counting(db)
    records = Records(restarted)
    assert await records.count_usage(user, day, "gen-b", 7, 3, 2) == (UsageDay(user, day, 57, 13, 2, 2), True)
    assert (restarted.reads, restarted.batches) == (0, 2)  # refused as new, then applied on the answer's totals
    again = _Counting(db)
    assert await Records(again).count_usage(user, day, "gen-a", 50, 10, 0) == (UsageDay(user, day, 57, 13, 2, 2),
                                                                               False)
    assert (again.reads, again.batches) == (0, 1)  # a redelivery: refused, and the answer says it was counted
    assert await records.count_usage(user, day, "gen-c", 1, 1, 0) == (UsageDay(user, day, 58, 14, 2, 3), True)
    assert (restarted.reads, restarted.batches) == (0, 3)  # its own totals remembered: one batch
    assert await records.usage_day(user, day) == UsageDay(user, day, 58, 14, 2, 3)
    # Racing on a new day, each process trying it as new: every generation counted once, the totals exact.
    racer, gens = new_id(), [f"gen-{i}" for i in range(6)]
    results = await asyncio.gather(*(Records(db).count_usage(racer, day, g, 1, 2, 0) for g in gens + gens[:3]))
    assert sum(new for _, new in results) == 6
    assert await records.usage_day(racer, day) == UsageDay(racer, day, 6, 12, 0, 6)


def test_migrations_apply_once(stack_settings: Settings) -> None:
    assert apply(stack_settings) == []  # the fixture already applied them; a rerun changes nothing


async def test_usage_counts_race_and_legacy_days_exactly(db) -> None:  # type: ignore[no-untyped-def]
    """The day totals are a compare-and-set: counters racing each other (the agent and the reconciler, a
    redelivery beside the first delivery) count each generation once; a day counted before the totals existed
    (ledger rows only) is summed once and then counted on from there."""
    records, user, day = Records(db), new_id(), "2026-12-01"
    await db.execute("INSERT INTO usage_by_generation (user_id, day, generation_id, tokens_in, tokens_out, "
                     "tokens_cached) VALUES (?, ?, 'old', 100, 10, 1)", (user, day))
    gens = [f"gen-{i}" for i in range(6)]
    results = await asyncio.gather(*(records.count_usage(user, day, g, 1, 2, 0) for g in gens + gens[:3]))
    assert sum(new for _, new in results) == 6
    # Racing writers may leave usage_by_day one count behind; the totals are exact and the next count says so.
    again, new = await records.count_usage(user, day, gens[0], 1, 2, 0)
    assert not new and again == UsageDay(user, day, 106, 22, 1, 7) == await records.usage_day(user, day)
