"""Apply the versioned CQL migrations in order, each once.

Applied versions are recorded in ``schema_migrations`` with their names; every
statement is ``IF NOT EXISTS`` so a migration interrupted half-way can simply run
again. A version recorded under another name (a keyspace migrated by another
checkout of the code) is applied again, for the same reason, and re-recorded.
"""
from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from cassandra.cluster import Session

from infra.config.settings import Settings
from infra.stores.session import connect

log = logging.getLogger(__name__)
MIGRATIONS_DIR = Path(__file__).parent
_NAME = re.compile(r"^(\d{3})_([a-z0-9_]+)\.cql$")


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    statements: tuple[str, ...]


def load_migrations(directory: Path = MIGRATIONS_DIR) -> list[Migration]:
    found = []
    for path in sorted(directory.glob("*.cql")):
        match = _NAME.match(path.name)
        if not match:
            raise ValueError(f"migration file {path.name} must be named NNN_name.cql")
        found.append(Migration(int(match[1]), match[2], _statements(path.read_text())))
    versions = [m.version for m in found]
    if len(set(versions)) != len(versions):
        raise ValueError(f"duplicate migration versions in {directory}")
    return found


def _statements(text: str) -> tuple[str, ...]:
    body = "\n".join(line for line in text.splitlines() if not line.strip().startswith("--"))
    return tuple(s.strip().rstrip(";").strip() for s in re.split(r"^\s*;\s*$", body, flags=re.M) if s.strip())


def create_keyspace(session: Session, keyspace: str, replication_factor: int = 1, dc: str = "datacenter1") -> None:
    session.execute(
        f"CREATE KEYSPACE IF NOT EXISTS {keyspace} WITH replication = "
        f"{{'class': 'NetworkTopologyStrategy', '{dc}': {replication_factor}}}"
    )
    session.execute(
        f"CREATE TABLE IF NOT EXISTS {keyspace}.schema_migrations "
        "(version int PRIMARY KEY, name text, applied_at timestamp)"
    )


def apply_to(session: Session, keyspace: str, replication_factor: int = 1, dc: str = "datacenter1") -> list[int]:
    """Apply pending migrations; return the versions applied now."""
    create_keyspace(session, keyspace, replication_factor, dc)
    session.set_keyspace(keyspace)
    done = {row.version: row.name for row in session.execute("SELECT version, name FROM schema_migrations")}
    applied = []
    for migration in load_migrations():
        if done.get(migration.version) == migration.name:
            continue
        if migration.version in done:
            log.warning("cql migration %03d is recorded in %s as %r, not %r: applying %r again",
                        migration.version, keyspace, done[migration.version], migration.name, migration.name)
        for statement in migration.statements:
            session.execute(statement, timeout=60)
        session.execute(
            "INSERT INTO schema_migrations (version, name, applied_at) VALUES (%s, %s, %s)",
            (migration.version, migration.name, datetime.now(UTC)),
        )
        log.info("cql migration %03d_%s applied to %s", migration.version, migration.name, keyspace)
        applied.append(migration.version)
    return applied


def apply(settings: Settings) -> list[int]:
    cluster, session = connect(settings, keyspace=None)
    try:
        return apply_to(session, settings.keyspace, settings.cassandra_replication, settings.cassandra_dc)
    finally:
        cluster.shutdown()
