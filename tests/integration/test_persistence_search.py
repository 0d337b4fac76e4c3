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
