"""How much grammar a structured-output regex becomes, read from its structure alone (no matching is run).

The engine's grammar compiler (xgrammar) unrolls every bounded repetition: ``x{1,n}`` becomes n copies of
``x``, and a quantified group inside another multiplies. Measured with xgrammar 0.2.8 on one thread and a
49,152-token vocabulary: ``^(a|aa){1,500}b$`` compiles in 0.06 s, ``{1,2000}`` in 1.0 s, ``{1,5000}`` held a
pool's engine for about 19 s. So a pattern is refused when any count is over ``MAX_REPEAT``, when its unrolled
size is over ``MAX_UNROLLED``, or when a repeated group holds another variable repetition (``(a+)+``,
``(\\w+\\s?)*``). Python's own regex parser reads the structure; it is linear in the pattern's length, which
is capped first.
"""
from __future__ import annotations

import re
from re import _constants as sre  # type: ignore[attr-defined]
from re import _parser as sre_parse  # type: ignore[attr-defined]
from typing import Any

from schemas.errors import ParleyError

MAX_PATTERN_CHARS = 1_000
MAX_REPEAT = 256  # the largest {m,n} count: (a|aa){1,256} compiles in 0.04 s
MAX_UNROLLED = 1_000  # atoms after unrolling every repetition, per pattern
_JS_NAMED_GROUP = re.compile(r"\(\?<(?![=!])")  # ECMAScript's (?<name>...) is Python's (?P<name>...)
_REPEATS = (sre.MAX_REPEAT, sre.MIN_REPEAT, getattr(sre, "POSSESSIVE_REPEAT", sre.MAX_REPEAT))
_ATOMS = (sre.LITERAL, sre.NOT_LITERAL, sre.ANY, sre.IN, sre.CATEGORY, sre.GROUPREF)


class TooCostly(ParleyError, ValueError):
    """The pattern is unreadable or would be too costly to compile; the message says which and why."""

    status = 400  # as the gateway answers it (a schema too costly)


def check(pattern: str) -> int:
    """The pattern's unrolled size (atoms), or ``TooCostly``."""
    if len(pattern) > MAX_PATTERN_CHARS:
        raise TooCostly(f"is {len(pattern):,} characters; the limit is {MAX_PATTERN_CHARS:,}")
    try:
        parsed = sre_parse.parse(_JS_NAMED_GROUP.sub("(?P<", pattern))
    except (re.error, RecursionError, OverflowError) as exc:
        raise TooCostly(f"is not a regular expression the engine can read ({exc})") from exc
    size = _size(parsed, inside_repeat=False)
    if size > MAX_UNROLLED:
        raise TooCostly(f"unrolls to {size:,} atoms (its repetition counts multiplied); the limit is "
                        f"{MAX_UNROLLED:,}")
    return size


def _size(items: Any, inside_repeat: bool) -> int:
    total = 0
    for op, av in items:
        total += _node(op, av, inside_repeat)
        if total > MAX_UNROLLED:
            return total  # already too large: no need to read the rest
    return total


def _node(op: Any, av: Any, inside_repeat: bool) -> int:
    if op in _ATOMS:
        return 1
    if op in _REPEATS:
        low, high, body = av
        return _repeat(low, high, body, inside_repeat)
    if op is sre.SUBPATTERN:
        return _size(av[-1], inside_repeat)
    if op is sre.BRANCH:
        return sum(_size(branch, inside_repeat) for branch in av[1])
    if op in (sre.ASSERT, sre.ASSERT_NOT):
        return _size(av[1], inside_repeat)
    if op is sre.GROUPREF_EXISTS:
        return _size(av[1], inside_repeat) + (_size(av[2], inside_repeat) if av[2] else 0)
    if op is getattr(sre, "ATOMIC_GROUP", None):
        return _size(av, inside_repeat)
    return 0  # anchors (^, $, \b) add nothing


def _repeat(low: int, high: int, body: Any, inside_repeat: bool) -> int:
    bounded = high != sre.MAXREPEAT
    count = high if bounded else low + 1
    largest = high if bounded else low
    if largest > MAX_REPEAT:
        raise TooCostly(f"repeats something up to {largest:,} times; the largest count allowed is {MAX_REPEAT}")
    variable = low != high and high > 1  # ? (0 or 1) is not a repetition that can pile up
    if inside_repeat and variable:
        raise TooCostly("nests one variable repetition inside another (like (a+)+); write it without "
                        "the outer quantifier")
    return _size(body, inside_repeat or variable) * max(count, 1)
