from pathlib import Path

import pytest

from infra.stores.cql.migrate import load_migrations


def test_migrations_are_numbered_and_split_into_statements() -> None:
    migrations = load_migrations()
    assert [m.version for m in migrations] == sorted(m.version for m in migrations)
    assert migrations[0].version == 1
    first = migrations[0].statements
    assert all(s.upper().startswith("CREATE TABLE IF NOT EXISTS") for s in first)
    assert any("messages" in s for s in first) and not any(s.endswith(";") for s in first)


def test_badly_named_migration_is_refused(tmp_path: Path) -> None:
    (tmp_path / "init.cql").write_text("CREATE TABLE IF NOT EXISTS x (a int PRIMARY KEY)")
    with pytest.raises(ValueError, match="NNN_name"):
        load_migrations(tmp_path)


def test_duplicate_versions_are_refused(tmp_path: Path) -> None:
    for name in ("001_a.cql", "001_b.cql"):
        (tmp_path / name).write_text("CREATE TABLE IF NOT EXISTS x (a int PRIMARY KEY)")
    with pytest.raises(ValueError, match="duplicate"):
        load_migrations(tmp_path)
