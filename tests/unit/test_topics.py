"""The catalogue is the one declaration of the topology: its columns, the stages' ROLEs and the code agree."""
from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

from schemas import ALL_EVENTS, EventDeadLettered
from schemas.scheduler import LANES
from topics import ALL, FIXED, GENERATE, Role, Topics, catalogue
from topics.catalogue import (
    ADMISSION,
    DAY_MS,
    DEADLETTER,
    GENERATION,
    MINUTE_MS,
    PERSISTENCE,
    PROMPT,
    PURGE,
    SCHEDULER,
    SETTLEMENT,
    STAGES,
    Topic,
)

ROOT = Path(__file__).resolve().parents[2]
STAGE_FOLDERS = ("consumers", "streams", "producers")
# Stages run by consumers.stage.Stage: the loop subscribes to the first topic of their ROLE, so their code never
# names it, and it dead-letters for them.
STAGE_LOOP = {ADMISSION, PROMPT, SCHEDULER, PERSISTENCE, SETTLEMENT, PURGE}
BY_NAME = {t.name: t for t in ALL}


def _roles() -> dict[str, tuple[Role, Path]]:
    """Every stage module's ROLE, found by reading the stage folders: stage -> (role, the code it covers)."""
    found: dict[str, tuple[Role, Path]] = {}
    for path in sorted(p for folder in STAGE_FOLDERS for p in (ROOT / folder).rglob("*.py")):
        tree = ast.parse(path.read_text())
        if not any(isinstance(n, ast.Assign) and any(getattr(t, "id", "") == "ROLE" for t in n.targets)
                   for n in tree.body):
            continue
        module = ".".join(path.relative_to(ROOT).with_suffix("").parts)
        role = importlib.import_module(module).ROLE
        assert role.stage not in found, f"two modules declare the role of {role.stage}"
        # A stage in its own package (consumers/generation/) is checked over the whole package.
        covered = path.parent if (path.parent / "__init__.py").exists() and path.parent.name not in STAGE_FOLDERS \
            else path
        found[role.stage] = (role, covered)
    return found


ROLES = _roles()


def _referenced(covered: Path) -> set[Topic]:
    """The catalogue topics the code under ``covered`` names: ``topics.<attr>``, ``topics.generate(...)`` and
    the catalogue's own constants (outside the ``ROLE`` declaration)."""
    by_attr = {t.attr: t for t in FIXED}
    constants = {name: t for name in dir(importlib.import_module("topics.catalogue"))
                 if isinstance(t := getattr(importlib.import_module("topics.catalogue"), name), Topic)}
    found: set[Topic] = set()
    for path in [covered] if covered.is_file() else sorted(covered.rglob("*.py")):
        tree = ast.parse(path.read_text())
        for node in tree.body:
            if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "ROLE" for t in node.targets):
                node.value = ast.Constant(None)  # the declaration itself is not a use
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and _is_topics(node.value):
                if node.attr in by_attr:
                    found.add(by_attr[node.attr])
                elif node.attr == "generate":
                    found.add(GENERATE)
            elif isinstance(node, ast.Name) and node.id in constants:
                found.add(constants[node.id])
    return found


def _is_topics(node: ast.expr) -> bool:
    if isinstance(node, ast.Name):
        return node.id == "topics"
    if isinstance(node, ast.Attribute):
        return node.attr == "topics"
    return isinstance(node, ast.Call) and getattr(node.func, "id", "") == "Topics"


def test_every_stage_declares_its_role_once() -> None:
    assert set(ROLES) == set(STAGES)


@pytest.mark.parametrize("topic", ALL, ids=lambda t: t.name)
def test_catalogue_columns_match_the_stages_roles(topic: Topic) -> None:
    writers = {stage for stage, (role, _) in ROLES.items() if topic in role.writes}
    readers = {stage for stage, (role, _) in ROLES.items() if topic in role.reads}
    assert set(topic.producers) == writers, f"{topic.name}: catalogue says {topic.producers}, roles say {writers}"
    assert set(topic.readers) == readers, f"{topic.name}: catalogue says {topic.readers}, roles say {readers}"


@pytest.mark.parametrize("stage", sorted(ROLES))
def test_each_role_matches_the_topics_its_code_names(stage: str) -> None:
    role, covered = ROLES[stage]
    declared = set(role.reads) | set(role.writes)
    used = _referenced(covered)
    assert used <= declared, f"{stage} uses {sorted(t.name for t in used - declared)} without declaring them"
    implicit = {DEADLETTER} | ({role.reads[0]} if stage in STAGE_LOOP else set())
    unused = declared - used - implicit
    assert not unused, f"{stage} declares {sorted(t.name for t in unused)} but its code never names them"


def test_token_buffer_keeps_ten_minutes() -> None:
    assert BY_NAME["chat.tokens"].retention_ms == 10 * MINUTE_MS


def test_request_reply_and_usage_topics_keep_a_week_or_more() -> None:
    for name in ("chat.requests", "chat.replies", "usage"):
        assert BY_NAME[name].retention_ms >= 7 * DAY_MS, name


def test_every_event_has_a_topic() -> None:
    carried = {e for t in ALL for e in t.events}
    assert set(ALL_EVENTS) <= carried | {EventDeadLettered}
    assert EventDeadLettered in carried


def test_prefix_applies_to_every_name() -> None:
    names = [n for n, _ in Topics("x.", ["large", "small"]).all()]
    assert names and all(n.startswith("x.") for n in names)
    assert Topics("x.").generate("large", "paid") == "x.generate.large.paid"
    assert len(set(names)) == len(FIXED) + 2 * len(LANES)


def test_generate_topics_follow_the_pools_given() -> None:
    names = {name for name, _ in catalogue(["tiny", "huge"])}
    assert {f"generate.{pool}.{lane}" for pool in ("tiny", "huge") for lane in LANES} <= names
    assert not any(n.startswith("generate.large") for n in names)


def test_group_names_come_from_the_stage_names() -> None:
    topics = Topics("t.")
    assert topics.group(ADMISSION) == "t.admission"
    assert topics.group(GENERATION, "small") == "t.generation.small"
    with pytest.raises(ValueError, match="unknown stage"):
        topics.group("worker")
    with pytest.raises(ValueError, match="per pool"):
        topics.group(GENERATION)
