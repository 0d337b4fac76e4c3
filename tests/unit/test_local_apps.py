"""The service processes `parley up` starts after the backbone (workers, stages, gateway): what is
started, readiness from logs and HTTP, process groups, records, and the start/reuse/stop cycle, run
against stand-in commands (tiny Python scripts), never the real subcommands."""

from __future__ import annotations

import dataclasses
import json
import os
import socket
import stat
import sys
import time
from pathlib import Path

import pytest

from infra.config.settings import Ports, Settings
from infra.local import stack
from infra.local.errors import PortInUse, ServiceFailed, StackError
from infra.local.services import apps, process
from infra.local.services.apps import App, AppSpec, LogWatch

WORKER = """
import time  # standin-worker
print("loading the engine")
time.sleep(0.3)
print("worker ready pool=x")  # no flush: `up` must run it unbuffered
time.sleep(600)
"""
STAGES = """
import time  # standin-stages
print("stages ready")
time.sleep(600)
"""
GATEWAY = """
import http.server, sys  # standin-gateway
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path == "/healthz" else 404)
        self.end_headers()
    def log_message(self, *args):
        pass
http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
"""
# A leader whose child ignores SIGTERM, like an engine core that does not stop in time.
STUBBORN = """
import subprocess, sys, time  # standin-stubborn
child = subprocess.Popen([sys.executable, "-c",
    "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
    "print('child', 'up', flush=True); time.sleep(600)"])
print(f"{'child'} pid={child.pid}", flush=True)
time.sleep(600)
"""
# A leader that exits at once, leaving its child behind in its process group.
ORPHANING = """
import subprocess, sys, time  # standin-orphaning
child = subprocess.Popen([sys.executable, "-c", "import time; print('child', 'up', flush=True); time.sleep(600)"])
print(f"{'child'} pid={child.pid}", flush=True)
time.sleep(0.5)
"""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def standin(name: str, script: str, marker: str, **kw: object) -> AppSpec:
    args = [str(a) for a in kw.pop("args", [])]  # type: ignore[attr-defined]
    return AppSpec(name=name, kind=name.split("-")[0], command=(sys.executable, "-c", script, *args),
                   markers=(marker,), **kw)  # type: ignore[arg-type]


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return Settings(ports=Ports(gateway=free_port()), state_dir=tmp_path / "state", cache_dir=tmp_path / "cache")


def output(app: App) -> str:
    """Its log; the scripts print "child up" and "child pid=N" in ways the start banner, which
    quotes the script, does not contain."""
    return app.log_file.read_text()


def child_pid(app: App) -> int:
    return int(output(app).split("child pid=")[1].split()[0])


def wait_for(check, timeout: float = 10.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


# ------------------------------------------------------------------ what `up` starts


def test_specs_one_worker_per_pool_then_stages_then_gateway(settings: Settings) -> None:
    found = apps.specs(settings, ["large", "small"])
    assert [s.name for s in found] == ["worker-large", "worker-small", "stages", "gateway"]
    large, _, stages, gateway = found
    assert large.command[-3:] == ("worker", "--pool", "large") and large.markers == ("worker", "--pool", "large")
    assert large.ready_log == "worker ready" and large.timeout == 300
    assert stages.command[-1] == "stages" and stages.ready_log == "stages ready"
    assert gateway.command[-3:] == ("gateway", "--port", str(settings.ports.gateway))
    assert gateway.ready_url == f"http://127.0.0.1:{settings.ports.gateway}/healthz"
    assert gateway.port == settings.ports.gateway and gateway.ready_log is None
    assert [s.name for s in apps.specs(settings, ["large"], workers=False)] == ["stages", "gateway"]


def test_specs_carry_each_processs_fixed_metrics_port(settings: Settings) -> None:
    large, small, stages, gateway = apps.specs(settings, {"large": 9111, "small": 9112})
    assert (large.metrics_port, small.metrics_port) == (9111, 9112)
    assert stages.metrics_port == settings.ports.stages_metrics and gateway.metrics_port == settings.ports.gateway
    assert apps.specs(settings, ["large"])[0].metrics_port is None  # pools without ports: none to show


def test_prometheus_is_a_process_of_its_own_binary(settings: Settings) -> None:
    spec = apps.prometheus_spec(settings, ("/usr/bin/prometheus", "--config.file=/x/prometheus.yml"))
    assert spec.ready_url == f"http://127.0.0.1:{settings.ports.prometheus}/-/ready"
    assert apps.App(spec, settings).exe_names == ("prometheus",)
    assert apps.stop_tiers(["prometheus", "gateway", "worker-large"])[-1] == ["prometheus"]  # stopped last


def test_parley_command_prefers_the_venvs_script(tmp_path: Path) -> None:
    python = tmp_path / "bin" / "python"
    python.parent.mkdir()
    python.touch()
    assert apps.parley_command("stages", executable=str(python)) == [str(python), "-m", "infra.local.cli", "stages"]
    script = python.with_name("parley")
    script.write_text("#!/bin/sh\n")
    script.chmod(0o755)
    assert apps.parley_command("stages", executable=str(python)) == [str(script), "stages"]


def test_settings_env_round_trips_through_from_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    custom = Settings().with_(
        ports=Ports(kafka=19092, kafka_controller=19093, cassandra=19042, cassandra_storage=17000,
                    cassandra_jmx=17199, redis=16379, gateway=18000),
        state_dir=tmp_path / "s", cache_dir=tmp_path / "c", keyspace="k2", topic_prefix="t.",
        kafka_heap_mb=256, cassandra_heap_mb=512, reader_timeout_s=12.5, route_small_max_chars=80,
        plans_file=tmp_path / "plans.toml", pool_overrides=(("LARGE_MAX_SEQS", "4"),), debug=("a", "b.c"),
    )
    flags = {f.name: not getattr(custom, f.name) for f in dataclasses.fields(custom) if f.type in (bool, "bool")}
    custom = custom.with_(**flags)  # every boolean away from its default
    for key in list(os.environ):
        if key.startswith("PARLEY_"):
            monkeypatch.delenv(key)
    for key, value in custom.to_env().items():
        assert key.startswith("PARLEY_")
        monkeypatch.setenv(key, value)
    assert Settings.from_env() == custom


def test_stop_order_is_gateway_stages_then_all_workers() -> None:
    names = ["worker-small", "stages", "other", "gateway", "worker-large"]
    assert apps.stop_tiers(names) == [["gateway"], ["stages"], ["worker-large", "worker-small"], ["other"]]
    assert apps.stop_tiers([]) == []


def test_missing_subcommands() -> None:
    wanted = apps.specs(Settings(), ["large"])
    assert apps.missing_subcommands(wanted, {"up": 1}) == ["gateway", "stages", "worker"]
    assert apps.missing_subcommands(wanted, {"worker": 1, "stages": 1, "gateway": 1}) == []


def test_spec_record_round_trip() -> None:
    spec = apps.specs(Settings(), ["large"])[0]
    assert AppSpec.from_json(json.loads(json.dumps(spec.to_json()))) == spec


# ------------------------------------------------------------------ readiness


def test_log_watch_reads_only_new_lines_and_partial_ones(tmp_path: Path) -> None:
    log = tmp_path / "w.log"
    log.write_text("old run: worker ready pool=x\n")
    watch = LogWatch(log, log.stat().st_size)
    assert not watch.seen("worker ready")
    with log.open("a") as fh:
        fh.write("loading\nworker re")
    assert not watch.seen("worker ready")
    with log.open("a") as fh:
        fh.write("ady pool=x")  # the line is not finished yet
    assert watch.seen("worker ready")
    assert watch.seen("worker ready")  # remembered
    assert not LogWatch(tmp_path / "missing.log").seen("x")


def test_log_watch_reads_a_trimmed_log_from_its_start(tmp_path: Path) -> None:
    log = tmp_path / "w.log"
    log.write_text("x" * 500 + "\nloading\n")
    watch = LogWatch(log, log.stat().st_size)
    assert not watch.seen("worker ready")
    log.write_text("worker ready pool=x\n")  # its supervisor kept the log in w.log.1 and truncated it
    assert watch.seen("worker ready")


def test_watch_since_last_start_ignores_earlier_runs(tmp_path: Path) -> None:
    log = tmp_path / "w.log"
    b = process.START_BANNER
    log.write_text(f"{b} w at 1: x\nworker ready pool=x\n{b} w at 2: x\nloading\n")
    assert not LogWatch.since_last_start(log, "w").seen("worker ready")
    with log.open("a") as fh:
        fh.write("worker ready pool=x\n")
    assert LogWatch.since_last_start(log, "w").seen("worker ready")


@pytest.mark.parametrize("chunk", [7, 16, 50, 1 << 20])
def test_last_banner_offset_with_any_window(tmp_path: Path, chunk: int) -> None:
    log = tmp_path / "w.log"
    first = f"{process.START_BANNER} w at 1: x\n" + "noise\n" * 20
    second = f"{process.START_BANNER} w at 2: x\n" + "more\n" * 20
    log.write_text(first + second)
    assert apps.last_banner_offset(log, "w", chunk=chunk) == len(first)
    assert apps.last_banner_offset(log, "other", chunk=chunk) == 0
    assert apps.last_banner_offset(tmp_path / "none.log") == 0


def test_http_ok_is_false_when_nothing_listens() -> None:
    assert not apps.http_ok(f"http://127.0.0.1:{free_port()}/healthz", timeout=0.5)


# ------------------------------------------------------------------ process groups


def test_parse_stat_with_awkward_command_names() -> None:
    assert process.parse_stat("42 (a) b (c) S 1 40 39 0 -1") == ("S", 1, 40, 39)
    state, _, pgrp, sid = process.parse_stat(Path(f"/proc/{os.getpid()}/stat").read_text())
    assert (pgrp, sid) == (os.getpgrp(), os.getsid(0)) and state in "RS"


def test_a_zombie_leader_with_running_threads_is_alive(tmp_path: Path) -> None:
    """A JVM's main thread can exit first: /proc shows the leader as Z while other threads still hold
    its ports; `down` must wait for them, or an immediate `up` finds the ports taken."""

    def task(pid: int, tid: int, state: str) -> None:
        for where in (tmp_path / str(pid) / "task" / str(tid), *([tmp_path / str(pid)] if pid == tid else [])):
            where.mkdir(parents=True, exist_ok=True)
            (where / "stat").write_text(f"{tid} (java) {state} 1 {pid} {pid} 0 -1")

    task(10, 10, "Z")
    task(10, 11, "S")
    assert process.is_alive(10, tmp_path)
    task(10, 11, "Z")
    assert not process.is_alive(10, tmp_path)
    task(20, 20, "S")
    assert process.is_alive(20, tmp_path) and not process.is_alive(30, tmp_path)
    task(40, 40, "Z")  # an ordinary zombie: only the leader in task/
    assert not process.is_alive(40, tmp_path)


def test_stop_group_kills_a_child_that_ignores_sigterm(settings: Settings) -> None:
    app = App(standin("worker-x", STUBBORN, "standin-stubborn"), settings)
    pid, _ = app.launch()
    wait_for(lambda: "child up" in output(app))
    child = child_pid(app)
    assert process.group_members(pid) == sorted([pid, child])
    began = time.monotonic()
    line = app.stop(timeout=1.0)
    assert line == f"worker-x: killed (pid {pid} and its process group)"
    assert time.monotonic() - began < 8
    assert not process.is_alive(child) and not process.group_members(pid)
    assert not app.pid_file.exists() and not app.record_file.exists()


def test_stop_cleans_up_children_left_by_an_exited_leader(settings: Settings) -> None:
    app = App(standin("worker-x", ORPHANING, "standin-orphaning"), settings)
    pid, _ = app.launch()
    wait_for(lambda: "child up" in output(app))
    child = child_pid(app)
    wait_for(lambda: not process.is_alive(pid))
    assert app.our_pid() is None and process.group_members(pid) == [child]
    assert app.stop(timeout=5.0) == f"worker-x: stopped 1 leftover child process(es) of pid {pid}"
    assert not process.is_alive(child)


def test_stop_without_pid_file(settings: Settings) -> None:
    app = App(standin("stages", STAGES, "standin-stages"), settings)
    assert app.stop() is None  # never started: nothing to say
    app.record_file.parent.mkdir(parents=True)
    app.record_file.write_text(json.dumps(app.spec.to_json()))
    assert app.stop() == "stages: not running (no pid file)"
    assert not app.record_file.exists()


def test_stop_leaves_a_stranger_alone(settings: Settings) -> None:
    app = App(standin("stages", STAGES, "standin-stages"), settings)
    process.write_pid(app.pid_file, os.getpid())  # a recycled pid: alive, but not our process
    assert app.stop() == f"stages: pid {os.getpid()} is not our stages process; left it alone"
    assert not app.pid_file.exists()


# ------------------------------------------------------------------ start, reuse, status, stop


def test_start_reuse_status_and_stop_with_standins(settings: Settings) -> None:
    port = settings.ports.gateway
    wanted = [
        standin("worker-x", WORKER, "standin-worker", ready_log=apps.WORKER_READY, timeout=20),
        standin("stages", STAGES, "standin-stages", ready_log=apps.STAGES_READY, timeout=20),
        standin("gateway", GATEWAY, "standin-gateway", args=[port], port=port,
                ready_url=f"http://127.0.0.1:{port}/healthz", timeout=20),
    ]
    try:
        first = stack.start_apps(settings, wanted)
        assert [p.name for p in first] == ["worker-x", "stages", "gateway"]
        assert all(p.running and p.ready and p.started_by_up and p.pid for p in first), first
        assert all("started" in p.detail for p in first)
        pids = {p.name: p.pid for p in first}
        for p in first:
            assert os.getsid(p.pid) == p.pid and os.getpgid(p.pid) == p.pid  # own session and group
            assert (settings.state_dir / "logs" / f"{p.name}.log").exists()
            assert process.read_pid(settings.state_dir / "run" / f"{p.name}.pid") == p.pid
        worker_env = Path(f"/proc/{pids['worker-x']}/environ").read_bytes().split(b"\0")
        assert f"PARLEY_STATE_DIR={settings.state_dir}".encode() in worker_env
        assert f"PARLEY_GATEWAY_PORT={port}".encode() in worker_env

        began = time.monotonic()
        again = stack.start_apps(settings, wanted)
        assert time.monotonic() - began < 5
        assert {p.name: p.pid for p in again} == pids
        assert all("already running" in p.detail for p in again)

        by_name = {p.name: p for p in stack.status_apps(settings)}
        assert all(by_name[n].running and by_name[n].ready and by_name[n].pid == pids[n] for n in pids)
        # configured processes that were never started are listed, not counted as failures
        assert all(not p.running and not p.started_by_up for n, p in by_name.items() if n not in pids)
    finally:
        lines = stack.down(settings, keep_backbone=True, app_timeout=5)
    assert lines == [
        f"gateway: stopped (pid {pids['gateway']} and its process group)",
        f"stages: stopped (pid {pids['stages']} and its process group)",
        f"worker-x: stopped (pid {pids['worker-x']} and its process group)",
    ]
    assert not any(process.is_alive(pid) for pid in pids.values())
    assert not list((settings.state_dir / "run").glob("*.pid"))
    assert not list((settings.state_dir / "run").glob("*.json"))
    assert stack.stop_apps(settings) == []


def test_a_crashed_process_shows_in_status(settings: Settings) -> None:
    spec = standin("stages", STAGES, "standin-stages", ready_log=apps.STAGES_READY, timeout=20)
    (started,) = stack.start_apps(settings, [spec])
    os.kill(started.pid or 0, 9)
    wait_for(lambda: not process.is_alive(started.pid or 0))
    (status,) = [p for p in stack.status_apps(settings) if p.name == "stages"]
    assert status.started_by_up and not status.running and "exited" in status.detail
    assert stack.stop_apps(settings) == [f"stages: not running (removed stale pid file, pid {started.pid})"]


def test_a_process_that_exits_during_start_up_fails_with_its_log(settings: Settings) -> None:
    spec = standin("worker-x", "import sys; print('no engine here'); sys.exit(3)", "no engine",
                   ready_log=apps.WORKER_READY, timeout=20)
    with pytest.raises(ServiceFailed) as failed:
        stack.start_apps(settings, [spec])
    assert "worker-x" in failed.value.message and "exited during start-up" in failed.value.message
    assert "no engine here" in failed.value.log_tail


def test_several_failures_are_reported_together(settings: Settings) -> None:
    slow = standin("worker-a", "import time; time.sleep(600)", "worker-a", ready_log="worker ready", timeout=1)
    dead = standin("worker-b", "raise SystemExit(1)", "worker-b", ready_log="worker ready", timeout=20)
    try:
        with pytest.raises(StackError) as failed:
            stack.start_apps(settings, [slow, dead])
        assert failed.value.message.startswith("2 service processes failed to start")
        assert "did not become ready within 1 s (waiting for the line 'worker ready')" in failed.value.log_tail
        assert "parley up --worker-timeout" in failed.value.log_tail
        assert "exited during start-up" in failed.value.log_tail
    finally:
        stack.stop_apps(settings, timeout=2)


def test_gateway_port_held_by_a_stranger_is_refused(settings: Settings) -> None:
    port = settings.ports.gateway
    spec = standin("gateway", GATEWAY, "standin-gateway", args=[port], port=port,
                   ready_url=f"http://127.0.0.1:{port}/healthz", timeout=5)
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", port))
        holder.listen()
        with pytest.raises(PortInUse) as refused:
            stack.start_apps(settings, [spec])
    assert f"port {port}" in refused.value.message and "PARLEY_GATEWAY_PORT" in refused.value.hint
    assert not App(spec, settings).pid_file.exists()


def test_up_refuses_early_when_a_subcommand_is_missing(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(apps, "missing_subcommands", lambda wanted: ["worker"])
    with pytest.raises(StackError) as failed:
        stack.up_service(settings)
    assert "`parley worker` is not available" in failed.value.message
    assert "--backbone-only" in failed.value.hint
    assert not (settings.state_dir / "run").exists()  # nothing was started


# ------------------------------------------------------------------ demo user file


def test_demo_user_file_is_private_and_round_trips(tmp_path: Path) -> None:
    path = tmp_path / "state" / "demo-user.json"
    user = stack.DemoUser("u1", "free", "pk_secret", "parley", "2026-01-01T00:00:00+0000")
    old = os.umask(0o000)
    try:
        path.parent.mkdir()
        path.write_text("{}")
        path.chmod(0o644)
        stack.save_demo_user(path, user)
    finally:
        os.umask(old)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stack.load_demo_user(path) == user
    path.write_text("not json")
    assert stack.load_demo_user(path) is None
    assert stack.load_demo_user(tmp_path / "missing.json") is None
