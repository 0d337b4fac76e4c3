"""What indexing one exchange for search costs the stages: rows, and CPU to make and bind them.

The seeds' exchange: a ~200-token message and a ~640-token reply (English prose from this repository's docs).
Three sides in one run: every prefix length from 2 to 8 with an HMAC object per prefix of each word, bound by the
driver's ``BatchStatement.add`` (the index as it first was); ``SearchIndex.rows`` (the lengths of
``search.PREFIXES``, each distinct prefix hashed once) bound by ``BatchStatement.add``; and ``SearchIndex.rows``
bound as ``AsyncSession.batch`` binds them (``session.same_statement_batch``: each distinct value of a column
serialized once), which is what the stages run. Binding uses the real driver's prepared statement (Cassandra from
``parley up``); the statement is never sent.

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

    from infra.stores.session import connect, same_statement_batch

    settings = Settings.from_env()
    cluster, session = connect(settings)
    prepared = session.prepare(CQL.format(ks=settings.keyspace))
    texts = exchange()
    sides = ("first", "driver", "now")
    times: dict[str, list[float]] = {side: [] for side in sides}
    counts: dict[str, int] = {}
    for _ in range(args.rounds):
        for side in sides:
            began = time.perf_counter()
            made = (before_rows if side == "first" else now_rows)(texts)
            if side == "now":
                batch = same_statement_batch(prepared, made)
            else:
                batch = BatchStatement(batch_type=BatchType.UNLOGGED)
                for row in made:
                    batch.add(prepared, row)
            times[side].append((time.perf_counter() - began) * 1000)
            counts[side] = len(batch)
    cluster.shutdown()
    ms = {side: statistics.median(times[side]) for side in sides}
    print(f"one exchange ({len(search.words(texts[0]))} + {len(search.words(texts[1]))} distinct words), "
          f"median of {args.rounds} rounds; ratios to the first side")
    print(f"{'':28}{'first':>10}{'driver':>10}{'now':>10}{'driver/1st':>12}{'now/1st':>10}")
    print(f"{'rows':28}" + "".join(f"{counts[s]:>10}" for s in sides)
          + f"{counts['driver'] / counts['first']:>12.2f}{counts['now'] / counts['first']:>10.2f}")
    print(f"{'CPU to make and bind, ms':28}" + "".join(f"{ms[s]:>10.2f}" for s in sides)
          + f"{ms['driver'] / ms['first']:>12.2f}{ms['now'] / ms['first']:>10.2f}")

if __name__ == "__main__":
    main()
