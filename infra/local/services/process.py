"""Process plumbing shared by the services: pid files, background start with a log file, stop by
pid (only a process we can prove is ours), port checks, and waiting until ready with the log's tail
on failure.  Linux only: ownership and port holders are read from /proc."""

from __future__ import annotations

import datetime as _dt
import errno
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from infra.local.errors import ServiceFailed

START_BANNER = "----- parley: starting"

# Popen handles of children started by this Python process, so they get reaped (no zombies, no
# ResourceWarning) when `up` and `down` run in one process, as in the tests.
_children: dict[int, subprocess.Popen[bytes]] = {}


# ---------------------------------------------------------------- pid files


def read_pid(path: Path) -> int | None:
    """The pid in ``path``, or None when the file is missing, empty or not a positive integer."""
    try:
        text = path.read_text().strip()
    except (FileNotFoundError, NotADirectoryError):
        return None
    if not text.isdigit() or int(text) <= 0:
        return None
    return int(text)


def write_pid(path: Path, pid: int) -> None:
    """Write atomically, so a reader never sees a half-written pid."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(f"{pid}\n")
    os.replace(tmp, path)


def remove_pid(path: Path) -> None:
    path.unlink(missing_ok=True)


# ---------------------------------------------------------------- /proc


def _reap(pid: int) -> None:
    child = _children.get(pid)
    if child is not None and child.poll() is not None:
        _children.pop(pid, None)


def proc_state(pid: int, proc: Path = Path("/proc")) -> str | None:
    """One-letter state from /proc/PID/stat (R, S, D, Z, ...), or None when there is no such process."""
    try:
        stat = (proc / str(pid) / "stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    # "pid (comm) S ..." where comm may itself contain spaces or parentheses.
    return stat[stat.rfind(")") + 2 :].split(" ", 1)[0] or None


def parse_stat(stat: str) -> tuple[str, int, int, int]:
    """(state, ppid, process group, session) from the text of /proc/PID/stat."""
    fields = stat[stat.rfind(")") + 2 :].split()
    return fields[0], int(fields[1]), int(fields[2]), int(fields[3])


def group_members(pgid: int, proc: Path = Path("/proc")) -> list[int]:
    """Live (not zombie) processes in process group ``pgid`` whose session is also ``pgid``: what
    :func:`start` started (its own session and group, led by the pid it returned) and every child that
    did not leave, such as vLLM's engine-core process.  While any member lives, the kernel does not
    hand that number to a new process, so a match is ours even after the leader has exited."""
    _reap(pgid)  # a leader we started and that has exited must not linger as a zombie
    members = []
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            state, _ppid, pgrp, sid = parse_stat((entry / "stat").read_text())
        except (OSError, ValueError, IndexError):
            continue
        if pgrp == pgid and sid == pgid and (state not in ("Z", "X") or is_alive(int(entry.name), proc)):
            members.append(int(entry.name))
    return sorted(members)


def is_alive(pid: int, proc: Path = Path("/proc")) -> bool:
    """True for a live process; a zombie (exited, not yet reaped) counts as dead.  A leader thread
    shows as a zombie while the process's other threads still run (a JVM shutting down, its ports
    still bound): that counts as alive until the last thread has gone."""
    _reap(pid)
    state = proc_state(pid, proc)
    if state is None or state == "X":
        return False
    if state != "Z":
        return True
    try:
        tasks = [t.name for t in (proc / str(pid) / "task").iterdir() if t.name != str(pid)]
    except OSError:
        return False
    return any(proc_state(int(t), proc / str(pid) / "task") not in (None, "Z", "X") for t in tasks)


def proc_exe(pid: int) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/exe")
    except OSError:
        return None


def proc_cwd(pid: int) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/cwd")
    except OSError:
        return None


def proc_cmdline(pid: int) -> list[str]:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return [part.decode(errors="replace") for part in raw.split(b"\0") if part]


def is_ours(pid: int, *, exe_names: Iterable[str], cwd: Path, markers: Iterable[str] = ()) -> bool:
    """Whether ``pid`` is the process we started: its binary's name, its working directory (we start
    every service in its own state folder; Redis's ``dir`` keeps it there) and words in its command line
    all match.  A recycled pid fails at least one of these."""
    if not is_alive(pid):
        return False
    exe = proc_exe(pid)
    if exe is None or Path(exe.removesuffix(" (deleted)")).name not in set(exe_names):
        return False
    if proc_cwd(pid) != str(cwd.resolve()):
        return False
    cmdline = " ".join(proc_cmdline(pid))
    return all(marker in cmdline for marker in markers)


# ---------------------------------------------------------------- ports


def port_free(host: str, port: int) -> bool:
    """Whether a server could bind ``host:port`` now (what the service itself will try)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as exc:
            if exc.errno in (errno.EADDRINUSE, errno.EACCES):
                return False
            raise
    return True


def port_open(host: str, port: int, timeout: float = 1.0) -> bool:
    """Whether something accepts TCP connections on ``host:port``."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def listening_inodes(proc_net_tcp: str, port: int) -> set[int]:
    """Socket inodes in LISTEN state on ``port``, from the text of /proc/net/tcp or tcp6."""
    inodes: set[int] = set()
    for line in proc_net_tcp.splitlines()[1:]:
        fields = line.split()
        if len(fields) < 10:
            continue
        local, state, inode = fields[1], fields[3], fields[9]
        if state == "0A" and int(local.rsplit(":", 1)[1], 16) == port:
            inodes.add(int(inode))
    return inodes


def port_holders(port: int) -> list[int]:
    """Pids of processes listening on ``port`` (best effort; needs to read other processes' fds)."""
    inodes: set[int] = set()
    for name in ("tcp", "tcp6"):
        try:
            inodes |= listening_inodes(Path(f"/proc/net/{name}").read_text(), port)
        except OSError:
            pass
    if not inodes:
        return []
    wanted = {f"socket:[{i}]" for i in inodes}
    pids: list[int] = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fds = list((entry / "fd").iterdir())
        except OSError:
            continue
        for fd in fds:
            try:
                if os.readlink(fd) in wanted:
                    pids.append(int(entry.name))
                    break
            except OSError:
                continue
    return sorted(pids)


def describe_holders(port: int) -> str:
    pids = port_holders(port)
    if not pids:
        return "another process"
    return ", ".join(f"pid {p} ({' '.join(proc_cmdline(p))[:120] or '?'})" for p in pids)


# ---------------------------------------------------------------- logs


def tail(path: Path, lines: int = 40, since_banner: bool = True) -> str:
    """The last ``lines`` lines of a log, limited to the latest start when ``since_banner``."""
    try:
        with path.open("rb") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            fh.seek(max(0, size - 256 * 1024))
            text = fh.read().decode(errors="replace")
    except OSError:
        return "(no log)"
    if since_banner and START_BANNER in text:
        text = text[text.rfind(START_BANNER) :]
    return "\n".join(text.splitlines()[-lines:])


# ---------------------------------------------------------------- start / wait / stop


def start(
    name: str,
    cmd: list[str],
    *,
    log_file: Path,
    pid_file: Path,
    cwd: Path,
    env: dict[str, str] | None = None,
) -> int:
    """Start ``cmd`` in the background in its own session (it outlives ``parley up`` and ignores the
    terminal's Ctrl-C), stdout and stderr appended to ``log_file``; write its pid to ``pid_file``."""
    log_file.parent.mkdir(parents=True, exist_ok=True)
    cwd.mkdir(parents=True, exist_ok=True)
    with log_file.open("ab") as log:
        stamp = _dt.datetime.now().isoformat(timespec="seconds")
        log.write(f"{START_BANNER} {name} at {stamp}: {' '.join(cmd)}\n".encode())
        log.flush()
        child = subprocess.Popen(
            cmd,
            cwd=cwd,
            env={**os.environ, **(env or {})},
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            close_fds=True,
        )
    _children[child.pid] = child
    write_pid(pid_file, child.pid)
    return child.pid


def wait_until_ready(
    name: str,
    check: Callable[[], bool],
    *,
    pid: int | None,
    log_file: Path,
    timeout: float,
    interval: float = 0.5,
) -> float:
    """Call ``check`` until it returns True; return the seconds waited.  Raise
    :class:`ServiceFailed` with the log's tail when the process exits or ``timeout`` passes."""
    began = time.monotonic()
    while True:
        if check():
            return time.monotonic() - began
        if pid is not None and not is_alive(pid):
            raise ServiceFailed(
                f"{name} (pid {pid}) exited during start-up",
                hint=f"read {log_file}",
                log_tail=tail(log_file),
            )
        if time.monotonic() - began > timeout:
            raise ServiceFailed(
                f"{name} did not become ready within {timeout:.0f} s",
                hint=f"read {log_file}; a slow machine may need `parley up --timeout` raised",
                log_tail=tail(log_file),
            )
        time.sleep(interval)


def signal_pid(pid: int, sig: int) -> bool:
    try:
        os.kill(pid, sig)
        return True
    except ProcessLookupError:
        return False


def wait_gone(pids: Iterable[int], timeout: float) -> set[int]:
    """Wait until every pid has exited; return those still alive after ``timeout``."""
    left = set(pids)
    deadline = time.monotonic() + timeout
    while left:
        left = {p for p in left if is_alive(p)}
        if not left or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    return left


def stop(pid: int, timeout: float = 60.0) -> str:
    """SIGTERM, then SIGKILL after ``timeout``; return 'stopped', 'killed' or 'already gone'."""
    if not signal_pid(pid, signal.SIGTERM):
        return "already gone"
    if not wait_gone([pid], timeout):
        return "stopped"
    signal_pid(pid, signal.SIGKILL)
    wait_gone([pid], 10.0)
    return "killed"


def signal_group(pgid: int, sig: int) -> bool:
    try:
        os.killpg(pgid, sig)
        return True
    except (ProcessLookupError, PermissionError):
        return False


def stop_group(pgid: int, timeout: float = 20.0) -> str:
    """Stop a whole process group that :func:`start` began (the leader and children such as vLLM's
    engine core): SIGTERM to the group, SIGKILL to what is left after ``timeout``.  Return 'stopped',
    'killed' or 'already gone'."""
    if not group_members(pgid) or not signal_group(pgid, signal.SIGTERM):
        return "already gone"
    deadline = time.monotonic() + timeout
    while group_members(pgid):
        if time.monotonic() > deadline:
            signal_group(pgid, signal.SIGKILL)
            end = time.monotonic() + 10.0
            while group_members(pgid) and time.monotonic() < end:
                time.sleep(0.2)
            return "killed"
        time.sleep(0.2)
    return "stopped"
