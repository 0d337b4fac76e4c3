"""Persistence's logic with fake stores: the reply saved, one title request, titles and summaries stored."""
from __future__ import annotations

from consumers.persistence import Persistence
from consumers.prompt.builder import PromptBuilder
from schemas import GenerationFinished, GenerationRequested, RequestAdmitted, Usage, id_time, new_id
from schemas.scheduler import BACKGROUND_PRIORITY
from tests.fake_stores import FakeConversations, FakeRecords, FakeRedis, conversation
from topics import Topics


def finished(purpose: str = "reply", text: str = "Paris.", status: str = "complete",
             gid: str = "g1") -> GenerationFinished:
    return GenerationFinished(generation_id=gid, conversation_id="c", user_id="u", plan="free", message_id=gid,
                              turn=0, parent_id="um", status=status, text=text,  # type: ignore[arg-type]
                              usage=Usage(prompt_tokens=20, completion_tokens=3), model="Smol", pool="large",
                              worker_id="w", purpose=purpose, at=1_790_000_000.0)  # type: ignore[arg-type]


def persistence(title: str | None = None) -> tuple[Persistence, FakeConversations, FakeRecords]:
    convs, records = FakeConversations(conversation(title=title)), FakeRecords()
    chat_ids = lambda messages: [len(m["content"]) for m in messages]  # noqa: E731 - a stand-in tokenizer
    return Persistence(convs, records, FakeRedis(), Topics("t."), chat_ids), convs, records  # type: ignore[arg-type]


async def test_a_finished_reply_is_saved_and_asks_the_small_pool_for_a_title_once() -> None:
    p, convs, records = persistence()
    out = await p.handle(finished())
    saved = convs.messages[("c", 0, "g1")]
    assert (saved.role, saved.content, saved.status, saved.tokens_in, saved.tokens_out) == (
        "assistant", "Paris.", "complete", 20, 3)
    assert saved.generation_id == "g1" and (saved.model, saved.pool) == ("Smol", "large")
    # The reply's row is the generation's record: no ``generations`` row is written beside it.
    assert records.generations == {} and convs.touched[0][0] == "c"
    [(topic, request, key)] = out
    assert topic == "t.generate.small.free" and key == "c"
    assert isinstance(request, GenerationRequested) and request.purpose == "title"
    assert request.generation_id == "g1:title" and request.priority == BACKGROUND_PRIORITY
    assert await p.handle(finished()) == []  # a redelivery rewrites the same row and asks nothing again
    assert len(convs.messages) == 1


async def test_an_api_conversation_is_saved_but_neither_indexed_nor_titled() -> None:
    import dataclasses

    class Index:
        def __init__(self) -> None:
            self.indexed: list[str] = []

        async def index_many(self, user_id: str, conversation_id: str, entries: list[tuple[str, int, str]]) -> None:
            self.indexed += [message_id for message_id, _, _ in entries]

    convs = FakeConversations(dataclasses.replace(conversation(), source="api"))
    index, records = Index(), FakeRecords()
    p = Persistence(convs, records, FakeRedis(), Topics("t."), lambda m: [1], search=index)  # type: ignore[arg-type]
    assert await p.handle(finished()) == []  # no title request
    assert convs.messages[("c", 0, "g1")].content == "Paris." and records.generations == {}
    assert index.indexed == []
    # Made unlisted for the call: its first reply lists it where it was made, and does not update its row.
    assert convs.listed_as_made == ["c"] and convs.touched == []
    page_convs = FakeConversations(conversation())
    page_convs.messages[("c", 0, "um")] = dataclasses.replace(convs.messages[("c", 0, "g1")], message_id="um",
                                                              role="user", content="Capital?")
    page = Persistence(page_convs, FakeRecords(), FakeRedis(), Topics("t."), lambda m: [1],  # type: ignore[arg-type]
                       search=index)
    assert len(await page.handle(finished())) == 1 and index.indexed == ["um", "g1"]  # a page one is both
    assert page_convs.touched[0][0] == "c" and page_convs.listed_as_made == []  # and moves up


async def test_a_finish_carrying_its_question_is_indexed_and_titled_without_reading_the_turn() -> None:
    import dataclasses

    import msgspec

    class Index:
        def __init__(self) -> None:
            self.entries: list[tuple[str, int, str]] = []

        async def index_many(self, user_id: str, conversation_id: str, entries: list[tuple[str, int, str]]) -> None:
            self.entries += entries

    class Unread(FakeConversations):
        turn_reads = 0

        async def messages_of_turn(self, conversation_id, turn, message_ids):  # type: ignore[no-untyped-def]
            self.turn_reads += 1
            return await super().messages_of_turn(conversation_id, turn, message_ids)

    convs, index = Unread(conversation()), Index()
    p = Persistence(convs, FakeRecords(), FakeRedis(), Topics("t."),  # type: ignore[arg-type]
                    lambda m: [len(m[1]["content"])], search=index)
    carried = msgspec.structs.replace(finished(), question="What is the capital of France?",
                                      started_at=1_789_999_999.0)
    [(_, request, _)] = await p.handle(carried)
    assert convs.turn_reads == 0 and index.entries == [("um", 0, "What is the capital of France?"), ("g1", 0, "Paris.")]
    assert request.purpose == "title"  # asked with the carried question: its prompt holds it
    assert request.prompt_token_ids == [len("User: What is the capital of France?\nAssistant: Paris.")]
    assert convs.messages[("c", 0, "g1")].created_at.timestamp() == 1_789_999_999.0  # no id time: its start
    # A reply's id is a time-ordered one: it is dated by it, as the prompt builder dated its placeholder, so the
    # saved row's date is the one a reader saw while it streamed (and a redelivery writes the same).
    gid = new_id()
    await p.handle(msgspec.structs.replace(carried, generation_id=gid, message_id=gid))
    assert convs.messages[("c", 0, gid)].created_at == id_time(gid) == PromptBuilder._placeholder(
        RequestAdmitted(generation_id=gid, conversation_id="c", user_id="u", plan="free", message_id="um",
                        client_message_id="k", content="?", pool="large", reply_cap=8, reserved_tokens=9),
        0, "um", [])[0].created_at
    # A finish that carries none (made by the scheduler or the reaper) reads the turn, as before.
    convs.messages[("c", 0, "um")] = dataclasses.replace(convs.messages[("c", 0, "g1")], message_id="um", role="user",
                                                         content="Capital?")
    index.entries = []
    await p.handle(finished())
    assert convs.turn_reads == 1 and index.entries[0] == ("um", 0, "Capital?")


async def test_a_titled_conversation_or_a_reply_with_no_text_asks_for_no_title() -> None:
    titled, _, _ = persistence(title="Capitals")
    assert await titled.handle(finished()) == []
    fresh, convs, _ = persistence()
    assert await fresh.handle(finished(status="failed", text="")) == []  # e.g. a refusal closing its placeholder
    assert convs.messages[("c", 0, "g1")].status == "failed"


async def test_stopped_and_length_cut_replies_get_a_title_too() -> None:
    for status in ("stopped", "length"):
        fresh, convs, _ = persistence()
        [(topic, request, _)] = await fresh.handle(finished(status=status, text="Par"))
        assert request.purpose == "title" and topic.endswith("generate.small.free")
        assert convs.messages[("c", 0, "g1")].status == status


async def test_a_finished_title_is_cleaned_and_stored() -> None:
    p, convs, _ = persistence()
    assert await p.handle(finished(purpose="title", text='"Title: Capital of France"\nextra', gid="g1:title")) == []
    assert convs.conversations["c"].title == "Capital of France"
    assert convs.messages == {}  # a title is not a message


async def test_a_summary_is_stored_when_complete_or_cut_at_its_cap() -> None:
    p, _, records = persistence()
    await p.handle(finished(purpose="summary", text="  They talked about Paris.  ", gid="g1:summary"))
    await p.handle(finished(purpose="summary", text="half", status="failed", gid="g2:summary"))
    await p.handle(finished(purpose="summary", text="Cut at the cap", status="length", gid="g3:summary"))
    assert [(s.summary, s.tokens) for s in records.summaries] == [("They talked about Paris.", 3),
                                                                  ("Cut at the cap", 3)]


async def test_a_no_retention_plan_saves_no_text_and_destroys_the_key_as_the_reply_ends() -> None:
    from tests.fake_stores import FakeSealer

    convs, records, sealer = FakeConversations(conversation()), FakeRecords(), FakeSealer()
    sealer.keys.live.add("c")
    p = Persistence(convs, records, FakeRedis(), Topics("t."), lambda m: [1], sealer=sealer,  # type: ignore[arg-type]
                    keep_nothing=frozenset({"free"}))
    assert await p.handle(finished()) == []  # no title request either
    assert convs.messages == {} and records.summaries == []
    assert records.generations["g1"]["status"] == "complete"  # ids and counts only
    assert "c" not in sealer.keys.live


async def test_a_reply_of_a_deleted_conversation_writes_nothing() -> None:
    convs, records = FakeConversations(), FakeRecords()  # the conversation is gone (get answers None)
    p = Persistence(convs, records, FakeRedis(), Topics("t."), lambda m: [1])  # type: ignore[arg-type]
    assert await p.handle(finished()) == []
    assert convs.messages == {} and records.generations == {}


async def test_a_replys_writes_go_out_together_and_a_failed_one_fails_the_event_after_the_rest() -> None:
    import asyncio

    class Together(FakeConversations):
        """The reply's row is written only once the list has been touched: in a row, this would never end."""

        def __init__(self) -> None:
            super().__init__(conversation())
            self.touched_now = asyncio.Event()
            self.fail_touch = False

        async def save_message(self, message):  # type: ignore[no-untyped-def]
            await self.touched_now.wait()
            await super().save_message(message)

        async def touch(self, conv, at, title=None):  # type: ignore[no-untyped-def]
            self.touched_now.set()
            if self.fail_touch:
                raise ConnectionError("Cassandra went away")
            return await super().touch(conv, at, title)

    convs, records = Together(), FakeRecords()
    p = Persistence(convs, records, FakeRedis(), Topics("t."), lambda m: [1])  # type: ignore[arg-type]
    await asyncio.wait_for(p.handle(finished()), 2)
    assert convs.messages[("c", 0, "g1")].content == "Paris." and convs.touched
    failing, records = Together(), FakeRecords()
    failing.fail_touch = True
    p = Persistence(failing, records, FakeRedis(), Topics("t."), lambda m: [1])  # type: ignore[arg-type]
    try:
        await asyncio.wait_for(p.handle(finished()), 2)
        raise AssertionError("a failed write must fail the event, so that it is applied again")
    except ConnectionError:
        pass
    # The others were written all the same; applying the event again rewrites them with the same values.
    assert ("c", 0, "g1") in failing.messages


async def test_a_conversations_next_replies_read_no_row_until_someone_else_changes_it() -> None:
    import dataclasses

    import msgspec

    from infra.stores import keys
    from infra.stores.conversations import mark_changed

    p, convs, _ = persistence(title="Trip")
    redis = p.redis
    for n in range(3):  # one read for the first reply; the next ones move up the row this process wrote
        await p.handle(msgspec.structs.replace(finished(gid=f"g{n}"), turn=n, at=1_790_000_000.0 + n))
    assert convs.reads == 1
    assert [t[1].timestamp() for t in convs.touched] == [1_790_000_000.0, 1_790_000_001.0, 1_790_000_002.0]
    # Renamed by its owner (the gateway marks the change): read again, and the new title is what it keeps.
    convs.conversations["c"] = dataclasses.replace(convs.conversations["c"], title="Trip, day two")
    await mark_changed(redis, "c")
    await p.handle(msgspec.structs.replace(finished(gid="g3"), turn=3, at=1_790_000_003.0))
    assert convs.reads == 2 and convs.conversations["c"].title == "Trip, day two"
    await p.handle(msgspec.structs.replace(finished(gid="g4"), turn=4, at=1_790_000_004.0))
    assert convs.reads == 2  # the mark is as it was
    # Its partition moved away and back (another process may have written the row meanwhile): read again.
    p.forget_conversations()
    await p.handle(msgspec.structs.replace(finished(gid="g5"), turn=5, at=1_790_000_005.0))
    assert convs.reads == 3
    # Deleted: the deletion marks a change, so the row is read and found gone; nothing is written.
    del convs.conversations["c"]
    await redis.set(keys.conversation_changed("c"), "deleted")
    assert await p.handle(msgspec.structs.replace(finished(gid="g6"), turn=6)) == []
    assert ("c", 6, "g6") not in convs.messages


async def test_a_title_finish_reads_no_row_that_its_reply_just_wrote() -> None:
    p, convs, _ = persistence()
    [(_, request, _)] = await p.handle(finished())
    assert convs.reads == 1 and request.purpose == "title"
    await p.handle(finished(purpose="title", text="Capital of France", gid="g1:title"))
    assert convs.reads == 1 and convs.conversations["c"].title == "Capital of France"


async def test_an_openai_calls_reply_in_the_conversation_made_listed_for_it_reads_and_lists_nothing() -> None:
    import msgspec

    from infra.stores import keys

    p, convs, _ = persistence()
    convs.conversations["c"] = conversation(title=None)
    made = msgspec.structs.replace(finished(), made_listed=True, question="Capital of France?")
    assert await p.handle(made) == []  # neither titled nor indexed: an API call's
    assert convs.reads == 0 and convs.touched == [] and convs.listed_as_made == [] and convs.taken_off == []
    assert convs.messages[("c", 0, "g1")].content == "Paris."
    # A reply with no text: off the list again, as if it had never been listed.
    await p.handle(msgspec.structs.replace(made, generation_id="g2", message_id="g2", text="", status="failed"))
    assert convs.taken_off == ["c"] and convs.reads == 0
    # Changed under it (deleted by its owner while the call ran): read, found gone, nothing written.
    del convs.conversations["c"]
    await p.redis.set(keys.conversation_changed("c"), "deleted")
    assert await p.handle(msgspec.structs.replace(made, generation_id="g3", message_id="g3")) == []
    assert convs.reads == 1 and ("c", 0, "g3") not in convs.messages


async def test_a_page_conversations_first_reply_from_its_gateway_reads_no_row_and_is_listed_where_made() -> None:
    import msgspec

    from infra.stores import keys

    p, convs, _ = persistence()
    cid = new_id()  # made at its id's time, as ``Conversations.create`` makes one
    first = msgspec.structs.replace(finished(), conversation_id=cid, made_unlisted=True, question="Capital?")
    [(_, request, _)] = await p.handle(first)
    assert convs.reads == 0 and convs.touched == [] and convs.listed_as_made == [cid]
    assert request.purpose == "title" and convs.messages[(cid, 0, "g1")].content == "Paris."
    # Its title: the row alone (the list reads titles there), still without a read.
    await p.handle(msgspec.structs.replace(finished(purpose="title", text="Capital", gid="g1:title"),
                                           conversation_id=cid))
    assert convs.reads == 0 and convs.retitled == [(cid, "Capital")] and convs.touched == []
    # The next reply moves it up from where it was listed: the list row's key is the conversation's made time.
    await p.handle(msgspec.structs.replace(finished(gid="g2"), conversation_id=cid, turn=1))
    assert convs.reads == 0 and [t[0] for t in convs.touched] == [cid]
    # Not trusted: renamed before its reply (a change mark), or not the conversation's first turn (a message sent
    # through another gateway came first): the row is read, and the reply moves it up as usual.
    for changed, turn in ((True, 0), (False, 1)):
        q, qconvs, _ = persistence()
        if changed:
            await q.redis.set(keys.conversation_changed("c"), "renamed")
        await q.handle(msgspec.structs.replace(finished(), made_unlisted=True, turn=turn, question="Capital?"))
        assert qconvs.reads == 1 and qconvs.listed_as_made == [] and [t[0] for t in qconvs.touched] == ["c"]
