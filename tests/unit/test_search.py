"""Which words a message is found by, and how a hit reads (the Cassandra side is in the integration tests)."""
from __future__ import annotations

import pytest

from infra.stores import search
from infra.stores.search import fold, matches, snippet, words


def test_words_are_folded_distinct_and_skip_common_and_one_letter_words() -> None:
    assert words("The Café in Zürich, the CAFÉ! a 2 x42") == ["cafe", "zurich", "x42"]
    assert words("one two three four", limit=2) == ["one", "two"]
    assert words("the a of") == []


def test_a_query_word_matches_the_start_of_a_word() -> None:
    text = "Lighthouse keepers of Brittany"
    assert matches(text, ["light", "britt"]) and matches(text, ["keeper"])
    assert not matches(text, ["house"])  # inside a word, not its start
    assert not matches(text, ["light", "normandy"])  # every word must be there
    assert fold("ÉCOLE") == "ecole"


def test_a_snippet_is_cut_around_the_first_match() -> None:
    text = ("filler " * 40) + "the lighthouse keeper " + ("more " * 40)
    cut = snippet(text, ["lighthouse"])
    assert "lighthouse keeper" in cut and cut.startswith("…") and cut.endswith("…") and len(cut) <= 170
    assert snippet("short text", ["short"]) == "short text"


def test_terms_are_keyed_per_user_and_do_not_match_a_plain_hash_of_the_word() -> None:
    import hashlib

    from infra.stores.search import blind, terms

    ann, other = b"k" * 32, b"j" * 32
    assert blind(ann, "u1", "zebra") == blind(ann, "u1", "zebra")  # deterministic, so a query finds the rows
    assert blind(ann, "u1", "zebra") != blind(other, "u1", "zebra")  # another key: another term
    assert blind(ann, "u1", "zebra") != blind(ann, "u2", "zebra")
    guessed = hashlib.sha256(b"u1\x00zebra").hexdigest()
    assert guessed not in {t for _, t in terms(ann, "u1", "zebras")}  # a guess without the key confirms nothing
    assert len(terms(ann, "u1", "zebras")) == 3  # prefixes of 2, 3 and 5 letters


def test_a_query_word_is_looked_up_by_its_longest_indexed_prefix() -> None:
    from infra.stores.search import EVER_INDEXED, PREFIXES, looked_up, terms

    key = b"k" * 32
    assert [looked_up(w) for w in ("pa", "par", "pari", "paris", "parisian", "parisians")] == [
        "pa", "par", "par", "paris", "parisian", "parisian"]
    for word in ("pa", "par", "pari", "paris", "parisienne"):  # what a query looks up, indexing wrote
        assert terms(key, "u", looked_up(word))[-1] in terms(key, "u", "parisienne")
    # A deletion removes every length once written, not just the ones indexed now.
    assert len(terms(key, "u", "parisienne", EVER_INDEXED)) == 7 and set(PREFIXES) <= set(EVER_INDEXED)


def test_index_rows_are_each_words_terms_once_per_message_with_shared_prefixes_hashed_once(
        monkeypatch: pytest.MonkeyPatch) -> None:
    index = search.SearchIndex(None, None)  # type: ignore[arg-type]
    key = index.key("u")
    entries = [("m1", 0, "Harbour harbours, hare and the harp"), ("m2", 0, "Harbours again: a harp, a hat")]
    want = {(mid, t) for mid, _, text in entries for t in {t for w in search.words(text)
                                                           for _, t in search.terms(key, "u", w)}}
    hashed: list[str] = []
    real = search.blind
    monkeypatch.setattr(search, "blind", lambda k, u, p: (hashed.append(p), real(k, u, p))[1])
    rows = index.rows("u", "c1", entries)
    bucket = search.shard("c1")
    assert sorted((r[4], r[2]) for r in rows) == sorted(want)  # each message's terms, each once
    assert all(r[0] == "u" and r[1] == bucket and r[3] == "c1" and r[5] == 0 for r in rows)
    assert len(hashed) == len(set(hashed)) and "ha" in hashed  # "ha" of five words and two messages: once
