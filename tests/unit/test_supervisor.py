"""The supervisor `parley up` runs each service process under: a real child process, killed and restarted."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from infra.local.supervisor import FIRST_DELAY_S, MAX_DELAY_S, next_delay, read_restarts, trim_log


def test_backoff_doubles_to_the_cap_and_resets_after_a_healthy_run() -> None:
    delay, waits = FIRST_DELAY_S, []
    for _ in range(7):
        wait, delay = next_delay(delay, ran_s=0.5)
        waits.append(wait)
    assert waits == [1, 2, 4, 8, 16, 30, 30] and MAX_DELAY_S == 30
    assert next_delay(30.0, ran_s=120.0) == (1.0, 2.0)


def _wait_for(check, timeout: float = 20.0):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError("timed out")


def test_a_killed_child_is_restarted_and_counted_and_sigterm_stops_both(tmp_path: Path) -> None:
    log = (tmp_path / "svc.log").open("ab")
    env = {**os.environ, "PARLEY_STATE_DIR": str(tmp_path)}
    child = [sys.executable, "-c", "import time; print('svc up', flush=True); time.sleep(600)"]
    sup = subprocess.Popen([sys.executable, "-m", "infra.local.cli", "supervise", "svc", "--", *child],
                           stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    try:
        first = _wait_for(lambda: read_restarts(tmp_path, "svc").child_pid)
        _wait_for(lambda: "svc up" in (tmp_path / "svc.log").read_text())
        os.kill(first, signal.SIGKILL)  # the service dies; its supervisor does not
        record = _wait_for(lambda: (r := read_restarts(tmp_path, "svc")).child_pid not in (None, first) and r)
        assert record.restarts == 1 and record.last_exit == -signal.SIGKILL and sup.poll() is None
        text = _wait_for(lambda: (t := (tmp_path / "svc.log").read_text()).count("svc up") == 2 and t)
        assert "restart #1" in text
        sup.send_signal(signal.SIGTERM)
        assert sup.wait(timeout=20) is not None
        time.sleep(0.2)
        assert _gone(record.child_pid)  # type: ignore[arg-type]
        assert read_restarts(tmp_path, "svc").restarts == 1  # a stop is not a restart
    finally:
        if sup.poll() is None:
            os.killpg(sup.pid, signal.SIGKILL)
        log.close()


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    state = Path(f"/proc/{pid}/stat").read_text().split(") ")[-1][:1] if Path(f"/proc/{pid}/stat").exists() else "X"
    return state in ("Z", "X")


def test_what_a_killed_child_leaves_behind_is_stopped_before_the_restart(tmp_path: Path) -> None:
    # Like a worker and its vLLM engine core: the child starts a process of its own, then is SIGKILLed.
    # The orphan (which ignores SIGTERM, so SIGKILL is needed) must not outlive it.
    log = (tmp_path / "svc.log").open("ab")
    env = {**os.environ, "PARLEY_STATE_DIR": str(tmp_path)}
    orphan = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"
    child = [sys.executable, "-c", "import subprocess, sys, time; "
             f"p = subprocess.Popen([sys.executable, '-c', {orphan!r}]); "
             "open(sys.argv[1], 'a').write(f'{p.pid}\\n'); print('svc up', flush=True); time.sleep(600)",
             str(tmp_path / "orphans")]
    sup = subprocess.Popen([sys.executable, "-m", "infra.local.cli", "supervise", "svc", "--", *child],
                           stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    try:
        first = _wait_for(lambda: read_restarts(tmp_path, "svc").child_pid)
        left = int(_wait_for(lambda: (tmp_path / "orphans").exists() and (tmp_path / "orphans").read_text()))
        assert not _gone(left)
        os.kill(first, signal.SIGKILL)
        _wait_for(lambda: (r := read_restarts(tmp_path, "svc")).child_pid not in (None, first) and r)
        assert _gone(left)  # killed (SIGTERM ignored, so SIGKILL after the grace) and reaped before the restart
        text = (tmp_path / "svc.log").read_text()
        assert f"stopping 1 process(es) it left: {left}" in text
        second = _wait_for(lambda: len((tmp_path / "orphans").read_text().split()) == 2
                           and int((tmp_path / "orphans").read_text().split()[1]))
        sup.send_signal(signal.SIGTERM)  # a stop takes the new child's own process with it
        assert sup.wait(timeout=30) is not None
        assert _gone(second)
    finally:
        if sup.poll() is None:
            os.killpg(sup.pid, signal.SIGKILL)
        log.close()


def test_a_log_past_its_cap_is_kept_once_and_its_writers_go_on_at_its_new_end(tmp_path: Path) -> None:
    path = tmp_path / "svc.log"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)  # as process.start opens it
    other = os.open(path, os.O_WRONLY | os.O_APPEND)  # a second writer of the tree (vLLM's engine core)
    try:
        os.write(fd, b"a" * 60 + b"\n")
        assert trim_log(fd, max_bytes=100) is None  # under the cap: left alone
        os.write(other, b"b" * 60 + b"\n")
        kept = trim_log(fd, max_bytes=100)
        assert kept == tmp_path / "svc.log.1"
        assert kept.read_bytes() == b"a" * 60 + b"\n" + b"b" * 60 + b"\n"
        assert path.stat().st_size == 0
        os.write(other, b"after\n")
        os.write(fd, b"more\n")
        assert path.read_bytes() == b"after\nmore\n"  # appended at the new end: no hole of the old length
        os.write(fd, b"c" * 200)
        assert trim_log(fd, max_bytes=100) == kept and kept.read_bytes() == b"after\nmore\n" + b"c" * 200
    finally:
        os.close(fd)
        os.close(other)


def test_a_pipe_or_terminal_is_not_trimmed() -> None:
    read, write = os.pipe()
    try:
        os.write(write, b"x" * 200)
        assert trim_log(write, max_bytes=100) is None
    finally:
        os.close(read)
        os.close(write)
