"""Search over one user's conversation titles and messages: a per-user inverted index in Cassandra.

Cassandra 5.0's storage-attached indexes match whole column values only (no tokenizing analyzer;
that is DataStax's), so words are indexed by hand. Each word prefix of a message or title is one row of
``search_terms``, partitioned by (user, the conversation's shard: one of ``SHARDS``) and clustered by the
term. Every row of a conversation lies in one partition, so a message (or a whole exchange) is indexed by
one single-partition unlogged batch, one statement whatever its length; a query word is a term slice read
in each of the user's shards (and in its old hash bucket, where rows written before shards live), never the
whole ring. Rows are keyed, so indexing again changes nothing.
A retitled conversation leaves its old words behind; hits are checked against the current text.

The index holds no word in clear (message text is sealed everywhere else): a row's term is an
HMAC-SHA256, under the user's search key from the tenant key store, of (user, word prefix), for the prefixes
of ``PREFIXES`` letters (rows written before shards are partitioned by that hash's first byte). A query word is
looked up by the hash of its longest indexed prefix and every hit is checked against the message as it reads
now, so a query word between two indexed lengths finds its hits among the shorter prefix's.

Only some prefix lengths are indexed: a row per prefix is what indexing costs (an HMAC and a bound row in the
stages, a cell in Cassandra), and every length from 2 to 8 made about 5 rows a word, 800 for a 640-token reply.
Lengths 2, 3, 5 and 8 make about 3: a word of 4 letters is looked up by its first 3, of 6 or 7 by its first 5,
and the check against the text drops the others. Rows written when every length was indexed are still found
(they include these lengths). Keyed, a term cannot be confirmed by guessing a word and hashing it: that takes the key
(the master key file, or the KMS). Deleting a conversation removes its rows.
"""
from __future__ import annotations

import asyncio
import hashlib
import hmac
import re
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass

from infra.stores.conversations import Conversations
from infra.stores.session import AsyncSession

WORD = re.compile(r"\w+", re.UNICODE)
STOPWORDS = frozenset("a an and are as at be but by do for from has have i if in is it its of on or so that the "
                      "this to was we were with you your".split())
MAX_WORDS_INDEXED = 400  # of one message: a long reply is found by its first 400 distinct words
MAX_QUERY_WORDS = 6
ROWS_PER_WORD = 2000  # read at most this many hits of one query word
TITLE = ""  # message_id of a conversation's title row
SHARDS = tuple(f"s{n}" for n in range(4))  # a user's index partitions; a search reads each, per word
PREFIXES = (2, 3, 5, 8)  # the prefix lengths indexed; longer query words are checked against the text
PREFIX_MAX = PREFIXES[-1]
EVER_INDEXED = tuple(range(2, PREFIX_MAX + 1))  # every length rows were once written for (a deletion removes all)


@dataclass(frozen=True)
class Hit:
    conversation_id: str
    title: str | None
    message_id: str | None  # None: the title matched
    role: str | None
    snippet: str


def fold(text: str) -> str:
    """Lower case without accents, so "Café" is found by "cafe"."""
    return "".join(c for c in unicodedata.normalize("NFKD", text.casefold()) if not unicodedata.combining(c))


def words(text: str, limit: int = MAX_WORDS_INDEXED) -> list[str]:
    """Distinct searchable words, in order of first appearance."""
    out: dict[str, None] = {}
    for w in WORD.findall(fold(text)):
        if len(w) >= 2 and w not in STOPWORDS and len(w) <= 40:
            out.setdefault(w, None)
            if len(out) >= limit:
                break
    return list(out)


def blind(key: bytes, user_id: str, prefix: str) -> tuple[str, str]:
    """(bucket, term) of one word prefix of one user's index, under that user's search key."""
    digest = hmac.digest(key, f"{user_id}\x00{prefix}".encode(), "sha256").hex()  # one call, no HMAC object
    return digest[:2], digest


def shard(conversation_id: str) -> str:
    """The partition (with the user) of every index row of a conversation: not hex, so never an older bucket."""
    return SHARDS[int(hashlib.sha256(conversation_id.encode()).hexdigest()[:8], 16) % len(SHARDS)]


def terms(key: bytes, user_id: str, word: str, lengths: Sequence[int] = PREFIXES) -> list[tuple[str, str]]:
    """The (bucket, term) of each indexed prefix of ``word`` (the whole word too, when its length is indexed)."""
    return [blind(key, user_id, word[:n]) for n in lengths if n <= len(word)]


def prefixes(found: Sequence[str], lengths: Sequence[int] = PREFIXES) -> set[str]:
    """Every distinct indexed prefix of ``found`` words (a whole word too, when its length is indexed)."""
    return {w[:n] for w in found for n in lengths if n <= len(w)}


def looked_up(word: str) -> str:
    """The prefix a query word is looked up by: its longest indexed one (the word's hits are among its hits)."""
    return word[:max((n for n in PREFIXES if n <= len(word)), default=len(word))]


def matches(text: str, query_words: list[str]) -> bool:
    have = WORD.findall(fold(text))
    return all(any(w.startswith(q) for w in have) for q in query_words)


def snippet(text: str, query_words: list[str], width: int = 160) -> str:
    folded = fold(text)  # NFKD may change lengths: find the place in the folded text, cut the original
    at = min((i for q in query_words if (i := folded.find(q)) >= 0), default=0)
    if len(folded) != len(text):
        at = 0
    start = max(0, at - width // 3)
    cut = " ".join(text[start:start + width].split())
    return ("…" if start else "") + cut + ("…" if start + width < len(text) else "")


class SearchIndex:
    """``conversations`` seals with the tenant key store the index keys come from; without a sealer (unit tests
    of other stages) terms are keyed by a fixed key, so they are hashes, not words."""

    def __init__(self, db: AsyncSession, conversations: Conversations) -> None:
        self.db, self.conversations = db, conversations
        sealer = getattr(conversations, "sealer", None)
        self._tenants = sealer.keys.tenants if sealer is not None else None

    def key(self, user_id: str) -> bytes:
        return self._tenants.index_key(user_id) if self._tenants is not None else b"parley-unsealed-index"

    async def index(self, user_id: str, conversation_id: str, message_id: str, turn: int, text: str) -> None:
        """Index a message (or, with ``message_id=TITLE``, a title); idempotent."""
        await self.index_many(user_id, conversation_id, [(message_id, turn, text)])

    async def index_many(self, user_id: str, conversation_id: str, entries: list[tuple[str, int, str]]) -> None:
        """Index (message_id, turn, text) entries of one conversation in one statement: every row of a
        conversation lies in its shard's partition, and a single-partition unlogged batch is one write on each
        replica (nor is it held to the batch size limit, which counts multi-partition batches only)."""
        cql = ("INSERT INTO search_terms (user_id, bucket, term, conversation_id, message_id, turn) "
               "VALUES (?, ?, ?, ?, ?, ?)")
        rows = self.rows(user_id, conversation_id, entries)
        if rows:
            await self.db.batch(cql, rows)

    def rows(self, user_id: str, conversation_id: str,
             entries: list[tuple[str, int, str]]) -> list[tuple[str, str, str, str, str, int]]:
        """The index rows of (message_id, turn, text) entries. Each distinct prefix is hashed once for them all:
        most short prefixes are shared by many words, and by a message and its reply (the seeds' exchange: 560
        HMACs, not 914)."""
        key, bucket = self.key(user_id), shard(conversation_id)
        hashed: dict[str, str] = {}
        rows = []
        for message_id, turn, text in entries:
            for prefix in prefixes(words(text)):
                term = hashed.get(prefix)
                if term is None:
                    term = hashed[prefix] = blind(key, user_id, prefix)[1]
                rows.append((user_id, bucket, term, conversation_id, message_id, turn))
        return rows

    async def forget(self, user_id: str, conversation_id: str, texts: list[str]) -> int:
        """Remove a conversation's rows for the words of ``texts`` (its messages and title, read before its key
        is destroyed); how many words. A range delete per word: (term, conversation_id) prefixes the key, in
        the conversation's shard and in the bucket rows written before shards had. Every prefix length is
        removed, indexed now or not: rows written when every length was indexed go too."""
        found = sorted({w for text in texts for w in words(text)})
        key = self.key(user_id)
        rows = {blind(key, user_id, p) for p in prefixes(found, EVER_INDEXED)}  # each prefix hashed once
        places = {(bucket, term) for bucket, term in rows} | {(shard(conversation_id), term) for _, term in rows}
        await asyncio.gather(*(self.db.execute(
            "DELETE FROM search_terms WHERE user_id = ? AND bucket = ? AND term = ? AND conversation_id = ?",
            (user_id, bucket, term, conversation_id)) for bucket, term in places))
        return len(found)

    async def search(self, user_id: str, query: str, limit: int = 20) -> list[Hit]:
        """Messages and titles holding every word of ``query`` (each as a word prefix), newest first."""
        wanted = words(query, MAX_QUERY_WORDS)
        if not wanted:
            return []
        found = await asyncio.gather(*(self._lookup(user_id, w) for w in wanted))
        common = set.intersection(*(set(f) for f in found))
        turns = found[0]
        # Titles first, then messages newest first (ids are time-ordered).
        order = [k for k in common if k[1] == TITLE] + sorted((k for k in common if k[1] != TITLE),
                                                              key=lambda k: k[1], reverse=True)
        hits: list[Hit] = []
        for conversation_id, message_id in order:
            hit = await self._check(user_id, conversation_id, message_id, turns[(conversation_id, message_id)],
                                    wanted)
            if hit is not None:
                hits.append(hit)
                if len(hits) >= limit:
                    break
        return hits

    async def _lookup(self, user_id: str, word: str) -> dict[tuple[str, str], int]:
        """The word's hits in every shard of the user's index, and in its bucket of rows written before shards."""
        bucket, term = blind(self.key(user_id), user_id, looked_up(word))
        found = await asyncio.gather(*(self.db.execute(
            "SELECT conversation_id, message_id, turn FROM search_terms WHERE user_id = ? AND bucket = ? "
            f"AND term = ? LIMIT {ROWS_PER_WORD}", (user_id, b, term)) for b in (bucket, *SHARDS)))
        return {(r.conversation_id, r.message_id): r.turn for rows in found for r in rows}

    async def _check(self, user_id: str, conversation_id: str, message_id: str, turn: int,
                     wanted: list[str]) -> Hit | None:
        """The hit as it reads now, or None when it no longer matches (retitled, deleted, someone else's)."""
        conv = await self.conversations.get(conversation_id)
        if conv is None or conv.user_id != user_id:
            return None
        if message_id == TITLE:
            ok = conv.title is not None and matches(conv.title, wanted)
            return Hit(conversation_id, conv.title, None, None, conv.title or "") if ok else None
        message = await self.conversations.get_message(conversation_id, turn, message_id)
        if message is None or not matches(message.content, wanted):
            return None
        return Hit(conversation_id, conv.title, message_id, message.role, snippet(message.content, wanted))
