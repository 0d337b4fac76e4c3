"""Persistence makes an exchange searchable when its reply is saved, and a title when it is written; a
redelivered event indexes nothing twice (real Cassandra and Redis)."""
from __future__ import annotations

from typing import Any

import msgspec

from consumers.persistence import Persistence
from infra.stores.conversations import Conversations, Message
from infra.stores.records import Records
from infra.stores.search import SearchIndex
from schemas import GenerationFinished, Usage, new_id
from topics import Topics


async def test_a_saved_reply_and_its_message_and_title_are_found(db: Any, redis_client: Any, topic_prefix: str) -> None:
    conversations = Conversations(db)
    search = SearchIndex(db, conversations)
    persistence = Persistence(conversations, Records(db), redis_client, Topics(topic_prefix), lambda _: [1, 2],
                              search=search)
    user = f"u-{new_id()}"
    conv = await conversations.create(user)
    asked = Message(conv.conversation_id, 0, new_id(), "user", "How tall is the Eiffel tower?")
    await conversations.save_message(asked)
    gen = new_id()
    done = GenerationFinished(generation_id=gen, conversation_id=conv.conversation_id, user_id=user, plan="free",
                              message_id=gen, turn=0, parent_id=asked.message_id, status="complete",
                              text="About 330 metres, antenna included.", model="m", pool="large", worker_id="w",
                              usage=Usage(prompt_tokens=10, completion_tokens=8))
    outs = await persistence.handle(done)
    assert [o[1].purpose for o in outs] == ["title"]
    await persistence.handle(done)  # redelivered: the same rows again

    hits = await search.search(user, "eiffel")
    assert [(h.message_id, h.role) for h in hits] == [(asked.message_id, "user")]
    assert [(h.message_id, h.snippet) for h in await search.search(user, "metres antenna")] == \
        [(gen, "About 330 metres, antenna included.")]
    assert await search.search("someone-else", "eiffel") == []

    await persistence.handle(msgspec.structs.replace(done, generation_id=f"{gen}:title", purpose="title",
                                                 text="Eiffel Tower Height"))
    [title, *rest] = await search.search(user, "eiffel")
    assert (title.message_id, title.title) == (None, "Eiffel Tower Height") and [h.role for h in rest] == ["user"]


async def test_query_words_between_indexed_lengths_are_found_and_a_deletion_removes_rows_of_every_length(
        db: Any) -> None:
    from infra.stores.search import EVER_INDEXED, shard, terms

    conversations = Conversations(db)
    search = SearchIndex(db, conversations)
    user = f"u-{new_id()}"
    conv = await conversations.create(user)
    said = Message(conv.conversation_id, 0, new_id(), "user", "Parisienne lighthouses")
    await conversations.save_message(said)
    await search.index(user, conv.conversation_id, said.message_id, 0, said.content)
    for query in ("pa", "par", "pari", "paris", "parisi", "parisienne", "lighthouse"):  # each length, 2 to 10
        assert [h.message_id for h in await search.search(user, query)] == [said.message_id], query
    assert await search.search(user, "parish") == []  # found among "pari"'s hits, dropped by the text check

    # Rows written when every length from 2 to 8 was indexed: a deletion takes them all.
    key, bucket = search.key(user), shard(conv.conversation_id)
    await db.batch("INSERT INTO search_terms (user_id, bucket, term, conversation_id, message_id, turn) "
                   "VALUES (?, ?, ?, ?, ?, ?)",
                   [(user, bucket, t, conv.conversation_id, said.message_id, 0)
                    for w in ("parisienne", "lighthouses") for _, t in terms(key, user, w, EVER_INDEXED)])
    assert await search.forget(user, conv.conversation_id, [said.content]) == 2
    left = await db.execute("SELECT term FROM search_terms WHERE user_id = ? AND bucket = ?", (user, bucket))
    assert list(left) == []


async def test_a_rename_between_replies_is_kept_by_the_next_reply_that_reads_no_row(db: Any, redis_client: Any,
                                                                                   topic_prefix: str) -> None:
    """Persistence keeps the row it wrote; a rename marks the change, so the next reply's list row carries the
    new title, and the list holds the conversation once, at its newest reply."""
    import time
    from datetime import UTC, datetime

    from infra.stores.conversations import mark_changed

    class Counted(Conversations):
        reads = 0

        async def get(self, conversation_id: str):  # type: ignore[no-untyped-def]
            self.reads += 1
            return await super().get(conversation_id)

    conversations = Counted(db)
    persistence = Persistence(conversations, Records(db), redis_client, Topics(topic_prefix), lambda _: [1])
    user = f"u-{new_id()}"
    conv = await conversations.create(user, title="First title")
    conversations.reads = 0
    began = round(time.time()) + 1.0

    def reply(turn: int) -> GenerationFinished:
        gen = new_id()
        return GenerationFinished(generation_id=gen, conversation_id=conv.conversation_id, user_id=user,
                                  plan="free", message_id=gen, turn=turn, status="complete", text=f"Reply {turn}.",
                                  model="m", pool="large", worker_id="w", usage=Usage(completion_tokens=2),
                                  at=began + turn)

    await persistence.handle(reply(0))
    await persistence.handle(reply(1))
    assert conversations.reads == 1
    gateway = Conversations(db)  # renames what it reads now, as the gateway's route does
    now = await gateway.get(conv.conversation_id)
    assert now is not None
    await gateway.rename(now, "Renamed")
    await mark_changed(redis_client, conv.conversation_id)
    await persistence.handle(reply(2))
    await persistence.handle(reply(3))
    assert conversations.reads == 2
    listed, _ = await conversations.list_for_user(user)
    assert [(c.conversation_id, c.title) for c in listed] == [(conv.conversation_id, "Renamed")]
    assert listed[0].updated_at.replace(tzinfo=UTC) == datetime.fromtimestamp(began + 3, UTC)
    rows = await db.execute("SELECT updated_at FROM conversations_by_user WHERE user_id = ?", (user,))
    assert len(list(rows)) == 1  # each reply's move took the previous list row away
