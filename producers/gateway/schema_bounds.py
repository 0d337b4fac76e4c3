"""Limits on a structured-output JSON schema (``response_format`` json_schema), checked before the request
reaches Kafka or an engine: one iterative walk, no recursion, so any depth is read safely.

The engine compiles each schema into a grammar (xgrammar). Its cost grows with the schema's size and
nesting, with each regex ``pattern`` (``regex_bounds``), and, most of all, with string length bounds: measured
with xgrammar 0.2.8 on one thread and a 49,152-token vocabulary, ``maxLength`` 20 costs 0.27 s, 100 costs
1.8 s, and each distinct bound adds its own (five from 100 to 104: 10.7 s). Past the limits below a request
is a 400 that names the field, never a stalled engine or a 500.
"""
from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

from producers.gateway import regex_bounds
from schemas.errors import ParleyError

MAX_DEPTH = 64  # objects and arrays inside one another (about 32 nested object properties)
MAX_NODES = 2_000  # JSON values in the schema document
MAX_LENGTH_BOUNDS = 100  # distinct minLength/maxLength values added up
MAX_UNROLLED_TOTAL = 4_000  # every pattern's unrolled size added up
MAX_INT = (1 << 63) - 1  # the engine reads schema numbers as 64-bit integers
LENGTH_KEYWORDS = frozenset({"minLength", "maxLength"})
COUNT_KEYWORDS = LENGTH_KEYWORDS | {"minItems", "maxItems", "minProperties", "maxProperties"}
DATA_KEYWORDS = frozenset({"enum", "const", "default", "examples"})  # values, not schemas: no patterns there
NAME_MAPS = frozenset({"properties", "patternProperties", "$defs", "definitions", "dependentSchemas"})


class SchemaTooCostly(ParleyError, ValueError):
    """``where`` is the JSON path inside the schema (``properties.name.pattern``); the message says why."""

    status = 400  # as the gateway answers it

    def __init__(self, where: str, why: str) -> None:
        where = where if len(where) <= 120 else where[:117] + "..."  # a deep path: where its branch starts
        super().__init__(f"{where or 'the schema'} {why}")
        self.where = where


def check(schema: Any) -> None:
    """Raises ``SchemaTooCostly`` for a schema past any documented limit."""
    nodes, lengths, unrolled = 0, set(), 0
    for path, key, value, depth, keyword in _walk(schema):
        nodes += 1
        if nodes > MAX_NODES:
            raise SchemaTooCostly("", f"has more than {MAX_NODES:,} values; the limit is {MAX_NODES:,}")
        if depth > MAX_DEPTH:
            raise SchemaTooCostly(path, f"is nested {depth} levels deep; the limit is {MAX_DEPTH}")
        _number(path, value)
        if not keyword:
            continue
        if key in COUNT_KEYWORDS:
            _count(path, value)
        if key in LENGTH_KEYWORDS and isinstance(value, int):
            lengths.add(value)
            if sum(lengths) > MAX_LENGTH_BOUNDS:
                raise SchemaTooCostly(path, f"brings the schema's string length bounds to {sum(lengths):,} (each "
                                            f"distinct minLength/maxLength added up); the limit is "
                                            f"{MAX_LENGTH_BOUNDS}: each costs the engine time to compile")
        if key == "pattern" and isinstance(value, str):
            unrolled += _pattern(path, value)
        if key == "patternProperties" and isinstance(value, dict):
            unrolled += sum(_pattern(f"{path}.{name}", name) for name in value)
        if unrolled > MAX_UNROLLED_TOTAL:
            raise SchemaTooCostly(path, f"brings the schema's patterns to {unrolled:,} unrolled atoms; the limit "
                                        f"is {MAX_UNROLLED_TOTAL:,}")


def _walk(schema: Any) -> Iterator[tuple[str, str, Any, int, bool]]:
    """(path, key, value, depth, keyword) for every value, depth first, without recursion; ``keyword``:
    ``key`` is a schema keyword (not a property name, not inside an enum or a list)."""
    stack: list[tuple[str, str, Any, int, bool, bool]] = [("", "", schema, 1, False, False)]
    while stack:
        path, key, value, depth, keyword, data = stack.pop()
        yield path, key, value, depth, keyword
        if depth > MAX_DEPTH:
            continue  # the caller refuses it; its children are never pushed
        if isinstance(value, dict):
            names = keyword and key in NAME_MAPS
            stack.extend((f"{path}.{k}" if path else str(k), str(k), v, depth + 1, not (names or data),
                          data or (not names and k in DATA_KEYWORDS)) for k, v in value.items())
        elif isinstance(value, list):
            stack.extend((f"{path}[{i}]", key, v, depth + 1, False, data) for i, v in enumerate(value))


def _number(path: str, value: Any) -> None:
    if isinstance(value, bool):
        return
    if isinstance(value, int) and not -MAX_INT - 1 <= value <= MAX_INT:
        raise SchemaTooCostly(path, "is a number outside the 64-bit range the engine reads")
    if isinstance(value, float) and not math.isfinite(value):
        raise SchemaTooCostly(path, "is not a finite number")


def _count(path: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise SchemaTooCostly(path, "must be a whole number of at least 0")


def _pattern(path: str, pattern: str) -> int:
    try:
        return regex_bounds.check(pattern)
    except regex_bounds.TooCostly as exc:
        raise SchemaTooCostly(path, f"(a regular expression) {exc}") from exc
