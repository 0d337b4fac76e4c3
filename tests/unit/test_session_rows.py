"""Rows read from Cassandra are the driver's named tuples, their type made once per column set."""
from __future__ import annotations

import pytest
from cassandra.cqltypes import Int32Type, UTF8Type
from cassandra.protocol import ColumnMetadata
from cassandra.query import BatchStatement, BatchType, PreparedStatement, named_tuple_factory

from infra.stores.session import rows_as_named_tuples, same_statement_batch


def test_rows_read_like_the_drivers_and_share_one_type_per_column_set() -> None:
    columns = ["user_id", "[applied]", "updated_at"]  # an LWT's column too, which the driver renames
    ours, theirs = rows_as_named_tuples(columns, [("u", True, 1)]), named_tuple_factory(columns, [("u", True, 1)])
    assert ours[0]._fields == theirs[0]._fields and tuple(ours[0]) == tuple(theirs[0]) == ("u", True, 1)
    assert ours[0].user_id == "u" and ours[0].applied is True
    again = rows_as_named_tuples(columns, [("v", False, 2), ("w", True, 3)])
    assert type(again[0]) is type(ours[0]) and [r.user_id for r in again] == ["v", "w"]
    assert rows_as_named_tuples(columns, []) == []


def _prepared() -> PreparedStatement:
    columns = [ColumnMetadata("ks", "t", name, kind) for name, kind in
               (("user_id", UTF8Type), ("term", UTF8Type), ("message_id", UTF8Type), ("turn", Int32Type))]
    return PreparedStatement(columns, b"qid", [0], "INSERT INTO t (user_id, term, message_id, turn) "
                             "VALUES (?, ?, ?, ?)", "ks", 5, None, None)


def test_a_same_statement_batch_sends_what_the_drivers_own_binding_sends() -> None:
    prepared = _prepared()
    rows = [("u", f"term{i}", "m1" if i % 2 else "m2", i % 3) for i in range(50)] + [("u", "t", None, 7)]
    ours = same_statement_batch(prepared, rows)
    theirs = BatchStatement(batch_type=BatchType.UNLOGGED)
    for row in rows:
        theirs.add(prepared, row)
    assert ours._statements_and_parameters == theirs._statements_and_parameters  # noqa: SLF001
    assert len(ours) == 51 and ours.batch_type == BatchType.UNLOGGED
    assert ours.routing_key == theirs.routing_key and ours.keyspace == theirs.keyspace == "ks"
    first_values = ours._statements_and_parameters[1][2]  # noqa: SLF001
    assert first_values[0] is ours._statements_and_parameters[3][2][0]  # noqa: SLF001 - "u" serialized once


def test_a_same_statement_batch_refuses_a_row_of_the_wrong_length_or_type() -> None:
    with pytest.raises(ValueError, match="3 values for 4"):
        same_statement_batch(_prepared(), [("u", "a", "m", 1), ("u", "b", "m")])
    with pytest.raises(Exception):  # noqa: B017, PT011 - the driver's own serializer's error
        same_statement_batch(_prepared(), [("u", "a", "m", 1), ("u", "b", "m", "not a number")])
