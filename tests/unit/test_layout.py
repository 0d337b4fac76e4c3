"""The layout's rules, checked on the source: imports go down, names come from the catalogue, every
``PARLEY_*`` variable is read in one place and documented."""
from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from infra.config.settings import POOL_PREFIX, VARS, env_var
from topics.catalogue import STAGES, catalogue

ROOT = Path(__file__).resolve().parents[2]
CODE = ("schemas", "topics", "infra", "consumers", "streams", "producers")
# (folder, packages it must not import): arrows go one way, from the gateway and local orchestration down to
# schemas.
FORBIDDEN = [
    ("producers", ("consumers", "streams", "infra.planning")),
    ("streams", ("consumers", "producers", "infra.local", "infra.planning")),
    ("consumers", ("streams", "producers", "infra.local", "infra.planning")),
    ("infra/config", ("producers", "consumers", "streams", "infra.stores", "infra.local", "infra.planning")),
    ("infra/stores", ("producers", "consumers", "streams", "infra.local", "infra.planning")),
    ("topics", ("producers", "consumers", "streams", "infra")),
    ("schemas", ("producers", "consumers", "streams", "infra", "topics")),
    ("infra/planning", ("producers", "consumers", "streams", "infra.local", "infra.stores", "topics")),
]


def _sources(*folders: str) -> list[Path]:
    return sorted(p for folder in folders for p in (ROOT / folder).rglob("*.py"))


def _imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module)
        elif isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
    return names


@pytest.mark.parametrize(("folder", "forbidden"), FORBIDDEN, ids=[f for f, _ in FORBIDDEN])
def test_imports_only_go_down(folder: str, forbidden: tuple[str, ...]) -> None:
    wrong = [f"{path.relative_to(ROOT)}: {name}" for path in _sources(folder) for name in sorted(_imports(path))
             if any(name == f or name.startswith(f + ".") for f in forbidden)]
    assert not wrong, "imports against the layering:\n" + "\n".join(wrong)


def _topic_like(text: str) -> bool:
    if any(c.isspace() for c in text):
        return False  # prose (docstrings, messages) may name topics; a name in code has no spaces
    names = {name for name, _ in catalogue(["large", "small"])} - {"usage"}  # "usage" is also a JSON field
    groups = {f"{s}." for s in STAGES} | {"worker."}
    return text in names or text.startswith(("generate.", "chat.")) and "." in text[5:] \
        or any(text.startswith(g) and len(text) > len(g) for g in groups if g != "gateway.")


def test_no_topic_or_group_name_is_spelled_outside_topics() -> None:
    wrong = []
    for path in _sources("infra", "consumers", "streams", "producers"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and _topic_like(node.value):
                wrong.append(f"{path.relative_to(ROOT)}:{node.lineno}: {node.value!r}")
            if isinstance(node, ast.keyword) and node.arg == "group_id" and isinstance(
                    node.value, (ast.Constant, ast.JoinedStr)) and getattr(node.value, "value", "") is not None:
                wrong.append(f"{path.relative_to(ROOT)}:{node.lineno}: group_id spelled out")
    wrong = [w for w in wrong if "chat.completion" not in w]  # OpenAI's object names, not topics
    assert not wrong, "\n".join(wrong)


def test_parley_variables_are_named_only_in_settings() -> None:
    allowed = {ROOT / "infra" / "config" / "settings.py"}
    wrong = [f"{path.relative_to(ROOT)}:{n}: {line.strip()}" for path in _sources(*CODE) if path not in allowed
             for n, line in enumerate(path.read_text().splitlines(), 1) if "PARLEY_" in line]
    assert not wrong, "read these through Settings (infra/config/settings.py):\n" + "\n".join(wrong)


def test_every_variable_is_in_the_configuration_table() -> None:
    doc = (ROOT / "docs" / "configuration.md").read_text()
    assert "\n## Environment variables\n" in doc, "docs/configuration.md lost its variables table"
    section = doc.split("\n## Environment variables\n", 1)[1].split("\n## ", 1)[0]
    documented = set(re.findall(r"`(PARLEY_[A-Z0-9_<>]+)`", "\n".join(
        line for line in section.splitlines() if line.startswith("|"))))
    wanted = {env_var(v.name) for v in VARS} | {env_var(POOL_PREFIX + "<NAME>_<FIELD>")}
    assert wanted - documented == set(), "missing from docs/configuration.md's variables table"
    assert documented - wanted == set(), "docs/configuration.md documents variables Settings does not read"
