"""Rows read from Cassandra are the driver's named tuples, their type made once per column set."""
from __future__ import annotations

from cassandra.query import named_tuple_factory

from infra.stores.session import rows_as_named_tuples


def test_rows_read_like_the_drivers_and_share_one_type_per_column_set() -> None:
    columns = ["user_id", "[applied]", "updated_at"]  # an LWT's column too, which the driver renames
    ours, theirs = rows_as_named_tuples(columns, [("u", True, 1)]), named_tuple_factory(columns, [("u", True, 1)])
    assert ours[0]._fields == theirs[0]._fields and tuple(ours[0]) == tuple(theirs[0]) == ("u", True, 1)
    assert ours[0].user_id == "u" and ours[0].applied is True
    again = rows_as_named_tuples(columns, [("v", False, 2), ("w", True, 3)])
    assert type(again[0]) is type(ours[0]) and [r.user_id for r in again] == ["v", "w"]
    assert rows_as_named_tuples(columns, []) == []
