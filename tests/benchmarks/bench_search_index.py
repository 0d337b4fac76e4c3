"""What indexing one exchange for search costs the stages: rows, and CPU to make and bind them.

The seeds' exchange: a ~200-token message and a ~640-token reply (English prose from this repository's docs).
Both sides in one run: every prefix length from 2 to 8 with an HMAC object per prefix of each word (the index
as it was) against ``SearchIndex.index_many`` itself (the lengths of ``search.PREFIXES``, each distinct prefix
hashed once). Binding uses the real driver's
prepared statement (Cassandra from ``parley up``); the statement is never sent.

    python -m tests.benchmarks.bench_search_index [--rounds 20]
"""
from __future__ import annotations

import argparse
import hashlib
import hmac
import statistics
import time
from pathlib import Path

from infra.config.settings import Settings
from infra.stores import search

KEY = b"k" * 32
CQL = ("INSERT INTO {ks}.search_terms (user_id, bucket, term, conversation_id, message_id, turn) "
       "VALUES (?, ?, ?, ?, ?, ?)")


def exchange() -> tuple[str, str]:
    prose = " ".join(Path(__file__).resolve().parents[2].joinpath("docs", "architecture.md").read_text().split())
    return prose[:1000], prose[1000:4200]  # ~200 and ~640 tokens


def before_terms(user_id: str, word: str) -> list[str]:
    return [hmac.new(KEY, f"{user_id}\x00{word[:n]}".encode(), hashlib.sha256).hexdigest()
            for n in range(2, min(len(word), 8) + 1)]


def before_rows(texts: tuple[str, str]) -> list[tuple[object, ...]]:
    return [("u", "s0", term, "c", f"m{i}", 1) for i, text in enumerate(texts)
            for term in {t for w in search.words(text) for t in before_terms("u", w)}]


def now_rows(texts: tuple[str, str]) -> list[tuple[object, ...]]:
    index = search.SearchIndex(None, None)  # type: ignore[arg-type]  # no store: terms under the fixed key
    return index.rows("u", "c", [(f"m{i}", 1, text) for i, text in enumerate(texts)])  # type: ignore[return-value]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=20)
    args = parser.parse_args()
    from cassandra.query import BatchStatement, BatchType

    from infra.stores.session import connect

    settings = Settings.from_env()
    cluster, session = connect(settings)
    prepared = session.prepare(CQL.format(ks=settings.keyspace))
    texts = exchange()
    times: dict[str, list[float]] = {"before": [], "now": []}
    counts: dict[str, int] = {}
    for _ in range(args.rounds):
        for name, make in (("before", before_rows), ("now", now_rows)):
            began = time.perf_counter()
            made = make(texts)
            batch = BatchStatement(batch_type=BatchType.UNLOGGED)
            for row in made:
                batch.add(prepared, row)
            times[name].append((time.perf_counter() - began) * 1000)
            counts[name] = len(made)
    cluster.shutdown()
    before, now = statistics.median(times["before"]), statistics.median(times["now"])
    print(f"one exchange ({len(search.words(texts[0]))} + {len(search.words(texts[1]))} distinct words), "
          f"median of {args.rounds} rounds")
    print(f"{'':28}{'before':>10}{'now':>10}{'ratio':>8}")
    print(f"{'rows':28}{counts['before']:>10}{counts['now']:>10}{counts['now'] / counts['before']:>8.2f}")
    print(f"{'CPU to make and bind, ms':28}{before:>10.2f}{now:>10.2f}{now / before:>8.2f}")


if __name__ == "__main__":
    main()
