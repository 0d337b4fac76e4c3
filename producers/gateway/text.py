"""Text a client sends must be Unicode that every store and topic can carry.

JSON allows ``"\\ud800"`` (a lone surrogate), Python decodes it into a ``str``, and it only fails
when something encodes it to UTF-8 (Kafka, Cassandra): far too late, as a 500. Checked at the
edge instead, so the client gets a 422 that names the field.
"""
from __future__ import annotations

from typing import Annotated

import orjson
from pydantic import AfterValidator


def is_unicode(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _unicode(text: str) -> str:
    if not is_unicode(text):
        raise ValueError("not valid Unicode text (it contains a lone surrogate such as \\ud800)")
    return text


Text = Annotated[str, AfterValidator(_unicode)]


def first_non_unicode(value: object) -> str | None:
    """The JSON path of the first string (or key) in ``value`` that is not valid Unicode, else None.

    orjson encodes the whole body in C and refuses a lone surrogate, so a valid body (nearly every one)
    costs one pass at C speed; the walk that names the path runs only when that pass fails (a surrogate,
    or an integer orjson cannot hold, which the walk passes)."""
    try:
        orjson.dumps(value)
        return None
    except (orjson.JSONEncodeError, TypeError):
        pass
    stack: list[tuple[str, object]] = [("", value)]
    while stack:  # no recursion: the body may be nested hundreds deep
        where, item = stack.pop()
        if isinstance(item, str):
            if not is_unicode(item):
                return where or "body"
        elif isinstance(item, dict):
            for key, child in item.items():
                if isinstance(key, str) and not is_unicode(key):
                    return where or "body"
                stack.append((f"{where}.{key}" if where else str(key), child))
        elif isinstance(item, list):
            stack.extend((f"{where}[{i}]", child) for i, child in enumerate(item))
    return None
