"""The local stack that `parley up` runs: real Kafka, Cassandra and Redis processes."""

from __future__ import annotations

import dataclasses
import stat
import time
from pathlib import Path

import pytest

from infra.config.settings import Ports, Settings
from infra.local import stack
from infra.local.services import process
from infra.local.services.kafka import POM as KAFKA_POM
from infra.local.services.maven import pom_property

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def local() -> Settings:
    """The shared stack on the configured ports, started if it is not running (and left running)."""
    settings = Settings.from_env()
    stack.up(settings)
    return settings


def test_status_reports_all_three_with_versions(local: Settings) -> None:
    statuses = stack.status(local)
    assert [s.name for s in statuses] == ["kafka", "cassandra", "redis"]
    assert all(s.ok for s in statuses), statuses
    by_name = {s.name: s for s in statuses}
    assert by_name["kafka"].address == local.kafka_bootstrap
    assert by_name["kafka"].version == pom_property(KAFKA_POM, "kafka.version")
    assert (by_name["cassandra"].version or "").startswith("5.0.")
    assert (by_name["redis"].version or "").split(".")[0].isdigit()
    assert all(s.pid is not None and process.is_alive(s.pid) for s in statuses)


def test_second_up_is_quick_and_changes_nothing(local: Settings) -> None:
    before = {s.name: s.pid for s in stack.status(local)}
    began = time.monotonic()
    again = stack.up(local)
    elapsed = time.monotonic() - began
    assert all(s.ok for s in again), again
    assert {s.name: s.pid for s in again} == before
    assert all("already running" in s.detail for s in again)
    assert elapsed < 20, f"a second up took {elapsed:.1f} s"


def test_up_and_down_on_other_ports_leaves_nothing(local: Settings, tmp_path: Path) -> None:
    """A second, private stack on shifted ports and its own state folder: up, then down stops every
    process it started and nothing of the shared stack."""
    p = local.ports
    ports = Ports(
        kafka=p.kafka + 10000,
        kafka_controller=p.kafka_controller + 10000,
        cassandra=p.cassandra + 10000,
        cassandra_storage=p.cassandra_storage + 10000,
        cassandra_jmx=p.cassandra_jmx + 10000,
        redis=p.redis + 10000,
        gateway=p.gateway + 10000,
    )
    if not all(process.port_free(local.host, port) for port in (ports.kafka, ports.cassandra, ports.redis)):
        pytest.skip("the shifted ports are taken")
    private = local.with_(ports=ports, state_dir=tmp_path / "state", cassandra_heap_mb=512, kafka_heap_mb=256)
    shared_pids = {s.name: s.pid for s in stack.status(local)}
    try:
        up = stack.up(private)
        assert all(s.ok for s in up), up
        pids = [s.pid for s in up]
        assert all(pid is not None for pid in pids)
        assert {s.address for s in up} == {
            f"{local.host}:{ports.kafka}",
            f"{local.host}:{ports.cassandra}",
            f"{local.host}:{ports.redis}",
        }
    finally:
        lines = stack.down(private)
    assert len(lines) == 3 and all("stopped" in line or "killed" in line for line in lines), lines
    assert not any(process.is_alive(pid) for pid in pids if pid is not None)
    assert not any(s.ok for s in stack.status(private))
    assert not list((tmp_path / "state" / "run").glob("*.pid"))
    assert {s.name: s.pid for s in stack.status(local)} == shared_pids  # the shared stack is untouched
    assert stack.down(private) == [f"{n}: not running (no pid file)" for n in ("kafka", "cassandra", "redis")]


def test_demo_user_is_created_once_then_reused(local: Settings, tmp_path: Path) -> None:
    """`parley up` ends by making (once) a free-plan demo user, kept in state_dir/demo-user.json."""
    settings = local.with_(state_dir=tmp_path / "state")
    path = stack.demo_file(settings)
    first, new = stack.ensure_demo_user(settings)
    assert new and first.plan == "free" and first.token.startswith("pk_") and first.keyspace == local.keyspace
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stack.load_demo_user(path) == first
    again, new = stack.ensure_demo_user(settings)
    assert not new and again == first
    # a token that no longer resolves (keyspace wiped) is replaced by a fresh user
    stack.save_demo_user(path, dataclasses.replace(first, token="pk_no-such-token"))
    third, new = stack.ensure_demo_user(settings)
    assert new and third.user_id != first.user_id and stack.load_demo_user(path) == third
