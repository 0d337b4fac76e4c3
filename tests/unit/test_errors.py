"""Every exception class Parley defines derives from ParleyError (keeping its other bases, so every ``except``
that caught it still does), and those a user sees carry the HTTP status the gateway answers with."""
from __future__ import annotations

import ast
import builtins
from pathlib import Path

from infra.stores.accounts import TooManyTokens
from infra.stores.shares import TooManyShares
from producers.gateway.errors import ApiError, not_found
from producers.gateway.schema_bounds import SchemaTooCostly
from schemas.errors import ParleyError

ROOT = Path(__file__).resolve().parents[2]
CODE = ("schemas", "topics", "infra", "consumers", "streams", "producers")
BUILTIN_ERRORS = {name for name, value in vars(builtins).items()
                  if isinstance(value, type) and issubclass(value, BaseException)}


def _exception_classes() -> list[tuple[str, ast.ClassDef]]:
    """Classes whose bases include a builtin exception: each must also derive from ParleyError (directly, or
    through another of these)."""
    found = []
    for folder in CODE:
        for path in sorted((ROOT / folder).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.ClassDef):
                    bases = {b.id for b in node.bases if isinstance(b, ast.Name)}
                    if bases & BUILTIN_ERRORS:
                        found.append((f"{path.relative_to(ROOT)}:{node.name}", node))
    return found


def test_every_exception_class_derives_from_parley_error() -> None:
    classes = _exception_classes()
    assert classes  # the scan finds them
    ours = {node.name for _, node in classes} | {"ParleyError"}  # each of them checked here in turn
    wrong = [name for name, node in classes if node.name != "ParleyError"
             and not ({getattr(b, "id", "") for b in node.bases} & ours)]
    assert not wrong, "exception classes outside the ParleyError root:\n" + "\n".join(wrong)


def test_a_user_facing_error_carries_its_http_status() -> None:
    assert not_found("conversation").status == 404 and isinstance(not_found("conversation"), ParleyError)
    assert issubclass(ApiError, ParleyError)
    assert (TooManyTokens.status, TooManyShares.status, SchemaTooCostly.status) == (409, 429, 400)
    assert issubclass(SchemaTooCostly, ValueError)  # the other bases stay: what caught it still does
