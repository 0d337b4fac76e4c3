"""Connect to Cassandra and await its queries from asyncio.

The driver's asyncio reactor is experimental, so we keep the default (libev)
reactor and bridge each ``ResponseFuture`` onto the running loop.
"""
from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from functools import lru_cache
from typing import Any

from cassandra import ConsistencyLevel
from cassandra.cluster import EXEC_PROFILE_DEFAULT, Cluster, ExecutionProfile, ResponseFuture, Session
from cassandra.policies import DCAwareRoundRobinPolicy, ExponentialReconnectionPolicy
from cassandra.query import BatchStatement, BatchType, PreparedStatement, named_tuple_factory

from infra.config.settings import Settings


class _PreparedKeyspaceNotice(logging.Filter):
    """Cassandra 5 warns on every statement prepared with a keyspace, even when no `USE` was issued
    (the protocol's per-statement keyspace is exactly the unambiguous form it recommends)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "`USE <keyspace>` with prepared statements" not in record.getMessage()


logging.getLogger("cassandra.protocol").addFilter(_PreparedKeyspaceNotice())


RECONNECT_MAX_S = 5.0


@lru_cache(maxsize=1024)
def _row_type(colnames: tuple[str, ...]) -> Any:
    """The driver's own row type for these columns (its names, cleaned as it cleans them), made once."""
    return type(named_tuple_factory(list(colnames), [(None,) * len(colnames)])[0])


def rows_as_named_tuples(colnames: list[str], rows: list[Any]) -> list[Any]:
    """The driver's default rows (named tuples), without the namedtuple class it makes for every result: about
    95 µs per statement, on every statement a stage reads."""
    row = _row_type(tuple(colnames))
    return [row(*r) for r in rows]


def connect(settings: Settings, keyspace: str | None = "") -> tuple[Cluster, Session]:
    """A cluster and a session; ``keyspace=""`` means the configured one, ``None`` means none."""
    cluster = Cluster(
        settings.cassandra_contact_points,
        port=settings.ports.cassandra,
        execution_profiles={EXEC_PROFILE_DEFAULT: ExecutionProfile(
            load_balancing_policy=DCAwareRoundRobinPolicy(local_dc=settings.cassandra_dc), request_timeout=30,
            row_factory=rows_as_named_tuples,
            consistency_level=ConsistencyLevel.name_to_value[settings.cassandra_consistency])},
        protocol_version=5,
        connect_timeout=10,
        # The driver gives the control connection's reads of the system tables 2 s; a Cassandra just restarted
        # on a busy 2-core machine took longer, and a stage starting then failed to connect at all.
        control_connection_timeout=10,
        # The driver's default backoff grows to 600 s, so a client kept answering 503 for about a minute
        # after Cassandra was back. Capped at 5 s: at most one probe every 5 s per host while it is down.
        reconnection_policy=ExponentialReconnectionPolicy(base_delay=0.5, max_delay=RECONNECT_MAX_S,
                                                          max_attempts=None),  # never give up on a host
    )
    session = cluster.connect()
    # No `USE`: AsyncSession names the keyspace on each prepared statement instead.
    session.parley_keyspace = settings.keyspace if keyspace == "" else keyspace
    return cluster, session


class Page:
    """One page of rows and the opaque state that fetches the next."""

    def __init__(self, rows: list[Any], paging_state: bytes | None) -> None:
        self.rows, self.paging_state = rows, paging_state


class AsyncSession:
    """Awaitable queries over a driver session; statements are prepared once and reused."""

    def __init__(self, session: Session, keyspace: str | None = None) -> None:
        self.session = session
        self.keyspace = keyspace or getattr(session, "parley_keyspace", None) or session.keyspace
        self._prepared: dict[str, PreparedStatement] = {}

    def prepare(self, cql: str) -> PreparedStatement:
        stmt = self._prepared.get(cql)
        if stmt is None:
            # Name the keyspace on the statement itself: unambiguous, and Cassandra 5 warns otherwise.
            stmt = self._prepared[cql] = self.session.prepare(cql, keyspace=self.keyspace)
        return stmt

    async def execute(self, cql: str, params: Sequence[Any] = ()) -> list[Any]:
        return (await self.page(cql, params, fetch_size=None)).rows

    async def batch(self, cql: str, rows: Sequence[Sequence[Any]]) -> None:
        """One statement bound to many rows, sent as an unlogged batch (for rows of one partition)."""
        if rows:
            await _bridge(self.session.execute_async(same_statement_batch(self.prepare(cql), rows)))

    async def together(self, statements: Sequence[tuple[str, Sequence[Any]]]) -> None:
        """Several statements on rows of one partition as an unlogged batch: one mutation, applied at once."""
        await self._batch(BatchType.UNLOGGED, statements)

    async def atomically(self, statements: Sequence[tuple[str, Sequence[Any]]]) -> list[Any]:
        """Several statements as one logged batch (conditional when they carry ``IF``: one partition only)."""
        return (await self._batch(BatchType.LOGGED, statements)).rows

    async def _batch(self, kind: BatchType, statements: Sequence[tuple[str, Sequence[Any]]]) -> Page:
        batch = BatchStatement(batch_type=kind)
        for cql, params in statements:
            batch.add(self.prepare(cql), params)
        return await _bridge(self.session.execute_async(batch))

    async def page(self, cql: str, params: Sequence[Any] = (), fetch_size: int | None = 50,
                   paging_state: bytes | None = None) -> Page:
        bound = self.prepare(cql).bind(params)
        bound.fetch_size = fetch_size
        future = self.session.execute_async(bound, paging_state=paging_state)
        return await _bridge(future)


def same_statement_batch(prepared: PreparedStatement, rows: Sequence[Sequence[Any]]) -> BatchStatement:
    """An unlogged batch of ``prepared`` bound to each of ``rows``, serializing each distinct value of a column
    once. The driver's ``BatchStatement.add`` makes a ``BoundStatement`` per row and serializes every value of
    it again: most of what a search index batch cost the stages (hundreds of rows that differ in one column).
    The first row is bound by the driver itself, which checks it and sets the batch's routing key."""
    if len(rows) > 0xFFFF:
        raise ValueError(f"a batch holds at most {0xFFFF} statements, not {len(rows)}")
    batch = BatchStatement(batch_type=BatchType.UNLOGGED)
    if prepared.column_encryption_policy is not None:  # encrypted columns: the driver binds each row itself
        for row in rows:
            batch.add(prepared, row)
        return batch
    batch.add(prepared, rows[0])
    types = [column.type for column in prepared.column_metadata]
    version = prepared.protocol_version
    seen: list[dict[Any, bytes | None]] = [{} for _ in types]
    for row in rows[1:]:
        if len(row) != len(types):
            raise ValueError(f"{len(row)} values for {len(types)} bind markers")
        values = []
        for value, kind, known in zip(row, types, seen, strict=True):
            try:
                data = known.get(value, _UNSEEN)
            except TypeError:  # unhashable (a collection): serialized each time
                data = kind.serialize(value, version)
            if data is _UNSEEN:
                data = known[value] = None if value is None else kind.serialize(value, version)
            values.append(data)
        batch._add_statement_and_params(True, prepared.query_id, values)  # noqa: SLF001 - add's own last step
    return batch


_UNSEEN: Any = object()


def _bridge(future: ResponseFuture) -> asyncio.Future[Page]:
    loop = asyncio.get_running_loop()
    result: asyncio.Future[Page] = loop.create_future()

    def done(rows: list[Any]) -> None:
        page = Page(list(rows or []), future._paging_state)  # noqa: SLF001 - the driver's only handle on it
        loop.call_soon_threadsafe(_settle, result, page)

    def failed(exc: BaseException) -> None:
        loop.call_soon_threadsafe(_settle, result, exc)

    future.add_callbacks(done, failed)
    return result


def _settle(result: asyncio.Future[Page], outcome: Page | BaseException) -> None:
    if result.done():
        return
    if isinstance(outcome, BaseException):
        result.set_exception(outcome)
    else:
        result.set_result(outcome)
