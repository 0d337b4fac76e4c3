"""Pure logic of infra.local.services: pid files, ownership, ports, logs, config rendering. No JVM started."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from infra.config.settings import Ports, Settings
from infra.local.errors import PortInUse, ServiceFailed, StackError
from infra.local.services import java, maven, process
from infra.local.services.base import Probe, Service
from infra.local.services.cassandra import POM as CASSANDRA_POM
from infra.local.services.cassandra import YAML_TEMPLATE, render_yaml
from infra.local.services.kafka import POM as KAFKA_POM
from infra.local.services.kafka import random_cluster_id, render_properties, running_version, server_properties
from infra.local.services.redis import redis_conf

SLEEP = "/bin/sleep" if os.path.exists("/bin/sleep") else "/usr/bin/sleep"


# ------------------------------------------------------------------ pid files


def test_pid_file_round_trip(tmp_path: Path) -> None:
    pid_file = tmp_path / "run" / "x.pid"
    assert process.read_pid(pid_file) is None
    process.write_pid(pid_file, 4242)
    assert pid_file.read_text() == "4242\n"
    assert process.read_pid(pid_file) == 4242
    process.remove_pid(pid_file)
    assert not pid_file.exists()
    process.remove_pid(pid_file)  # removing twice is fine


@pytest.mark.parametrize("content", ["", "abc", "-5", "0", "12 34"])
def test_bad_pid_file_reads_as_none(tmp_path: Path, content: str) -> None:
    pid_file = tmp_path / "x.pid"
    pid_file.write_text(content)
    assert process.read_pid(pid_file) is None


# ------------------------------------------------------------------ processes


def test_alive_and_state_of_self() -> None:
    assert process.is_alive(os.getpid())
    assert process.proc_state(os.getpid()) in {"R", "S"}


def test_exited_unreaped_child_counts_as_dead() -> None:
    child = subprocess.Popen(["true"])
    deadline = time.monotonic() + 5
    while process.proc_state(child.pid) != "Z" and time.monotonic() < deadline:
        time.sleep(0.05)
    assert process.proc_state(child.pid) == "Z"
    assert not process.is_alive(child.pid)
    child.wait()
    assert process.proc_state(child.pid) is None


def test_start_wait_stop_and_ownership(tmp_path: Path) -> None:
    pid_file, log_file, cwd = tmp_path / "run" / "s.pid", tmp_path / "logs" / "s.log", tmp_path / "home"
    pid = process.start("sleeper", [SLEEP, "30"], log_file=log_file, pid_file=pid_file, cwd=cwd)
    try:
        assert process.read_pid(pid_file) == pid
        assert process.is_alive(pid)
        # Under load the child may not have exec'd `sleep` yet: give it a moment, bounded.
        deadline = time.monotonic() + 10
        while not process.is_ours(pid, exe_names=["sleep"], cwd=cwd, markers=["30"]) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert process.is_ours(pid, exe_names=["sleep"], cwd=cwd, markers=["30"])
        assert not process.is_ours(pid, exe_names=["java"], cwd=cwd)
        assert not process.is_ours(pid, exe_names=["sleep"], cwd=tmp_path)
        assert not process.is_ours(pid, exe_names=["sleep"], cwd=cwd, markers=["CassandraDaemon"])
        assert process.START_BANNER in log_file.read_text()
        assert os.getsid(pid) == pid  # own session: the terminal's Ctrl-C does not reach it
    finally:
        assert process.stop(pid, timeout=5) == "stopped"
    assert not process.is_alive(pid)
    assert process.stop(pid, timeout=1) == "already gone"


def test_stop_escalates_to_sigkill(tmp_path: Path) -> None:
    script = (
        "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
        "print('up' + 'and' + 'waiting', flush=True); time.sleep(60)"
    )
    log_file = tmp_path / "t.log"
    pid = process.start(
        "stubborn",
        [sys.executable, "-c", script],
        log_file=log_file,
        pid_file=tmp_path / "t.pid",
        cwd=tmp_path,
    )
    process.wait_until_ready(
        "stubborn",
        lambda: "upandwaiting" in log_file.read_text(),
        pid=pid,
        log_file=log_file,
        timeout=10,
        interval=0.05,
    )
    assert process.stop(pid, timeout=0.5) == "killed"
    assert not process.is_alive(pid)


def test_wait_reports_exit_with_log_tail(tmp_path: Path) -> None:
    log_file = tmp_path / "f.log"
    log_file.write_text("old run line\n")
    pid = process.start(
        "failing",
        ["sh", "-c", "echo boom: bad config; exit 3"],
        log_file=log_file,
        pid_file=tmp_path / "f.pid",
        cwd=tmp_path,
    )
    with pytest.raises(ServiceFailed) as info:
        process.wait_until_ready(
            "failing", lambda: False, pid=pid, log_file=log_file, timeout=10, interval=0.05
        )
    assert "exited during start-up" in str(info.value)
    assert "boom: bad config" in info.value.log_tail
    assert "old run line" not in info.value.log_tail  # only the latest start


def test_wait_times_out_with_actionable_message(tmp_path: Path) -> None:
    log_file = tmp_path / "w.log"
    log_file.write_text("still starting\n")
    with pytest.raises(ServiceFailed) as info:
        process.wait_until_ready(
            "slow", lambda: False, pid=None, log_file=log_file, timeout=0.2, interval=0.05
        )
    assert "did not become ready within" in str(info.value)
    assert "still starting" in str(info.value)


def test_tail_limits_lines_and_handles_missing(tmp_path: Path) -> None:
    log_file = tmp_path / "l.log"
    log_file.write_text("".join(f"line {i}\n" for i in range(100)))
    assert process.tail(log_file, lines=3).splitlines() == ["line 97", "line 98", "line 99"]
    assert process.tail(tmp_path / "missing.log") == "(no log)"


# ------------------------------------------------------------------ ports


def test_port_checks_and_holder() -> None:
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        assert not process.port_free("127.0.0.1", port)
        assert process.port_open("127.0.0.1", port)
        assert os.getpid() in process.port_holders(port)
        assert f"pid {os.getpid()}" in process.describe_holders(port)
    assert process.port_free("127.0.0.1", port)
    assert not process.port_open("127.0.0.1", port, timeout=0.2)


def test_listening_inodes_parses_proc_net_tcp() -> None:
    text = (
        "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n"
        "   0: 0100007F:2384 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 111 1\n"
        "   1: 0100007F:2384 0100007F:D431 01 00000000:00000000 00:00000000 00000000     0        0 222 1\n"
        "   2: 00000000:18EB 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 333 1\n"
    )
    assert process.listening_inodes(text, 9092) == {111}  # the ESTABLISHED one is not a listener
    assert process.listening_inodes(text, 6379) == {333}
    assert process.listening_inodes(text, 1) == set()


class _Dummy(Service):
    name = "dummy"
    exe_names = ("sleep",)

    def __init__(self, settings: Settings, port: int) -> None:
        super().__init__(settings)
        self._port = port

    @property
    def port(self) -> int:
        return self._port

    def command(self) -> list[str]:
        return [SLEEP, "30"]

    def probe(self, timeout: float = 3.0) -> Probe:
        return Probe(False)


def test_service_refuses_a_port_held_by_someone_else(tmp_path: Path) -> None:
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        dummy = _Dummy(Settings(state_dir=tmp_path), server.getsockname()[1])
        with pytest.raises(PortInUse) as info:
            dummy.ensure_ports_free()
        assert f"pid {os.getpid()}" in str(info.value)
        assert isinstance(info.value, StackError)


def test_service_stop_only_touches_its_own_process(tmp_path: Path) -> None:
    dummy = _Dummy(Settings(state_dir=tmp_path), 1)
    assert "no pid file" in dummy.stop()
    stranger = subprocess.Popen([SLEEP, "30"], cwd=tmp_path)  # right binary, wrong folder
    try:
        process.write_pid(dummy.pid_file, stranger.pid)
        assert dummy.our_pid() is None
        assert "left it alone" in dummy.stop()
        assert stranger.poll() is None
        assert not dummy.pid_file.exists()
    finally:
        stranger.kill()
        stranger.wait()
    supervisor = dummy.launch()
    try:
        assert dummy.supervisor_pid() == supervisor
        pid = _child_of(dummy)
    finally:
        stopped = dummy.stop(timeout=5)  # a supervisor left behind would restart its child for good
    assert stopped == f"dummy: stopped with its supervisor (pid {pid}, supervisor {supervisor})"
    assert dummy.our_pid() is None and dummy.supervisor_pid() is None and not dummy.pid_file.exists()
    assert not process.is_alive(pid) and not process.is_alive(supervisor)


def _child_of(service: Service, other_than: int | None = None, timeout: float = 20.0) -> int:
    """The service's pid once its supervisor has (re)started it and written the pid file."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        pid = service.our_pid()
        if pid is not None and pid != other_than:
            return pid
        time.sleep(0.1)
    raise AssertionError(f"{service.name} not (re)started within {timeout} s")


def test_a_killed_backbone_process_is_restarted_by_its_supervisor(tmp_path: Path) -> None:
    from infra.local.supervisor import read_restarts

    dummy = _Dummy(Settings(state_dir=tmp_path), 1)
    supervisor = dummy.launch()
    try:
        first = _child_of(dummy)
        os.kill(first, signal.SIGKILL)
        second = _child_of(dummy, other_than=first)
        # The supervisor records the restart, then the new child's pid: on a loaded machine the pid file can be
        # read between the two writes, so the record is waited for (at most 20 s), not read once.
        deadline = time.monotonic() + 20
        while (restarts := read_restarts(tmp_path, "dummy")).child_pid != second and time.monotonic() < deadline:
            time.sleep(0.1)
        assert dummy.supervisor_pid() == supervisor and restarts.restarts == 1 and restarts.child_pid == second
    finally:
        assert "with its supervisor" in dummy.stop(timeout=5)
    assert not process.is_alive(supervisor) and dummy.our_pid() is None


# ------------------------------------------------------------------ config rendering


def test_cassandra_yaml_renders_absolute_paths_and_ports(tmp_path: Path) -> None:
    text = render_yaml(
        YAML_TEMPLATE.read_text(), host="127.0.0.1", storage_port=7100, native_port=9142, home=tmp_path
    )
    assert "${" not in text
    conf = yaml.safe_load(text)
    assert conf["native_transport_port"] == 9142
    assert conf["storage_port"] == 7100
    assert conf["seed_provider"][0]["parameters"][0]["seeds"] == "127.0.0.1:7100"
    assert conf["data_file_directories"] == [str(tmp_path / "data")]
    for key in ("commitlog_directory", "saved_caches_directory", "hints_directory", "cdc_raw_directory"):
        assert Path(conf[key]).is_absolute() and Path(conf[key]).parent == tmp_path
    assert conf["endpoint_snitch"] == "SimpleSnitch"


def test_kafka_properties_follow_the_ports(tmp_path: Path) -> None:
    props = server_properties("127.0.0.1", 1, {1: (19092, 19093)}, tmp_path / "data")
    assert props["listeners"] == "PLAINTEXT://127.0.0.1:19092,CONTROLLER://127.0.0.1:19093"
    assert props["controller.quorum.voters"] == "1@127.0.0.1:19093"
    assert props["advertised.listeners"] == "PLAINTEXT://127.0.0.1:19092"
    assert props["log.dirs"] == str(tmp_path / "data")
    text = render_properties(props)
    assert "listeners=PLAINTEXT://127.0.0.1:19092,CONTROLLER://127.0.0.1:19093\n" in text
    assert props["offsets.topic.replication.factor"] == "1" and props["min.insync.replicas"] == "1"


def test_three_brokers_form_one_quorum_with_replication_three() -> None:
    from infra.config.settings import Settings
    from infra.local.stack import services

    settings = Settings.from_env({"PARLEY_KAFKA_BROKERS": "3", "PARLEY_KAFKA_PORT": "19092",
                                  "PARLEY_KAFKA_CONTROLLER_PORT": "19093"})
    assert settings.kafka_bootstrap == "127.0.0.1:19092,127.0.0.1:19094,127.0.0.1:19096"
    nodes = [s for s in services(settings) if s.name.startswith("kafka")]
    assert [n.name for n in nodes] == ["kafka", "kafka-2", "kafka-3"]
    assert [n.ports for n in nodes] == [{"client": 19092 + 2 * i, "controller": 19093 + 2 * i} for i in range(3)]
    ports = {n: settings.kafka_node_ports(n) for n in (1, 2, 3)}
    props = server_properties("127.0.0.1", 2, ports, Path("/d"), settings.kafka_replication, settings.kafka_min_insync)
    assert props["node.id"] == "2"
    assert props["listeners"] == "PLAINTEXT://127.0.0.1:19094,CONTROLLER://127.0.0.1:19095"
    assert props["controller.quorum.voters"] == "1@127.0.0.1:19093,2@127.0.0.1:19095,3@127.0.0.1:19097"
    for key in ("default.replication.factor", "offsets.topic.replication.factor",
                "transaction.state.log.replication.factor"):
        assert props[key] == "3", key
    assert props["min.insync.replicas"] == props["transaction.state.log.min.isr"] == "2"
    with pytest.raises(ValueError, match="1 .* or 3"):
        Settings.from_env({"PARLEY_KAFKA_BROKERS": "2"})


def test_kafka_version_comes_from_the_running_classpath(tmp_path: Path) -> None:
    lib = tmp_path / "kafka-4.4.0" / "lib"
    lib.mkdir(parents=True)
    for jar in ("kafka-clients-4.4.0.jar", "kafka_2.13-4.4.0.jar", "scala-library-2.13.18.jar"):
        (lib / jar).touch()
    assert (
        running_version(["java", "-Xmx1g", "-cp", f"{lib}/*", "kafka.Kafka", "server.properties"]) == "4.4.0"
    )
    assert running_version(["java", "kafka.Kafka"]) is None
    assert running_version(["java", "-cp", f"{tmp_path}/*", "kafka.Kafka"]) is None


def test_cluster_id_has_kafkas_uuid_shape() -> None:
    ids = {random_cluster_id() for _ in range(2000)}
    assert len(ids) == 2000
    assert all(len(i) == 22 and "=" not in i and "+" not in i and "/" not in i for i in ids)
    assert not any(i.startswith("-") for i in ids)  # kafka-storage would read it as an option


def test_redis_conf_is_loopback_and_append_only(tmp_path: Path) -> None:
    conf = redis_conf(host="127.0.0.1", port=6380, data_dir=tmp_path)
    lines = conf.splitlines()
    assert "bind 127.0.0.1" in lines and "port 6380" in lines
    assert "appendonly yes" in lines and "daemonize no" in lines
    assert f'dir "{tmp_path}"' in lines


def test_service_layout_lives_under_state_dir(tmp_path: Path) -> None:
    from infra.local.stack import services

    settings = Settings(state_dir=tmp_path / "state", cache_dir=tmp_path / "cache", ports=Ports(kafka=1111))
    kafka, cassandra, redis = services(settings)
    assert kafka.address == "127.0.0.1:1111"
    assert kafka.pid_file == tmp_path / "state" / "run" / "kafka.pid"
    assert cassandra.log_file == tmp_path / "state" / "logs" / "cassandra.log"
    assert redis.cwd == tmp_path / "state" / "redis" / "data"
    assert str(kafka.lib).startswith(str(tmp_path / "cache"))  # type: ignore[attr-defined]
    assert set(cassandra.ports) == {"native", "storage", "jmx"}


# ------------------------------------------------------------------ java and maven


@pytest.mark.parametrize(
    ("output", "major"),
    [
        ('openjdk version "17.0.15" 2025-04-15', 17),
        ('openjdk version "25" 2025-09-16', 25),
        ('java version "1.8.0_392"', 8),
        ("garbage", None),
    ],
)
def test_java_major_parsing(output: str, major: int | None) -> None:
    assert java.parse_major(output) == major


def test_java_candidates_prefer_java_home(tmp_path: Path) -> None:
    (tmp_path / "java-17-openjdk-amd64").mkdir()
    (tmp_path / "temurin-25-jdk-amd64").mkdir()
    found = java.candidates("/opt/jdk", jvm_root=str(tmp_path))
    assert found[0] == Path("/opt/jdk/bin/java")
    assert found[1:] == [tmp_path / "java-17-openjdk-amd64" / "bin" / "java"]


def test_only_a_java_17_is_accepted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = tmp_path / "jdk-25" / "bin" / "java"
    fake.parent.mkdir(parents=True)
    fake.write_text("#!/bin/sh\necho 'openjdk version \"25\" 2025-09-16' >&2\n")
    fake.chmod(0o755)
    monkeypatch.setattr(java, "candidates", lambda *a, **k: [fake, tmp_path / "missing" / "bin" / "java"])
    java.find_java17.cache_clear()
    try:
        with pytest.raises(java.JavaNotFound) as info:
            java.find_java17()
    finally:
        java.find_java17.cache_clear()
    assert "no Java 17" in str(info.value) and "Java 25" in str(info.value)
    assert "openjdk-17" in info.value.hint


def test_pom_versions_and_download_lines() -> None:
    assert maven.pom_property(KAFKA_POM, "kafka.version").startswith("4.")
    assert maven.pom_property(CASSANDRA_POM, "cassandra.version").startswith("5.0.")
    line = (
        "Downloaded from central: https://repo.maven.apache.org/maven2/org/apache/kafka/"
        "kafka_2.13/4.4.0/kafka_2.13-4.4.0.jar (6.3 MB at 12 MB/s)"
    )
    assert maven.parse_download(line) == ("kafka_2.13-4.4.0.jar", 6_300_000)
    assert maven.parse_download("Downloading from central: https://x/y.pom") is None


def test_lib_dir_is_complete_only_for_the_same_pom(tmp_path: Path) -> None:
    pom = tmp_path / "pom.xml"
    pom.write_text(KAFKA_POM.read_text())
    lib = maven.lib_dir(tmp_path / "cache", "kafka", "4.4.0")
    assert not maven.is_complete(lib, pom)
    lib.mkdir(parents=True)
    (lib.parent / ".complete").write_text(maven._pom_digest(pom))
    assert maven.is_complete(lib, pom)
    pom.write_text(pom.read_text().replace("4.4.0", "4.3.1"))
    assert not maven.is_complete(lib, pom)
