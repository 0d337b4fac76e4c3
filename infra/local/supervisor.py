"""``parley supervise NAME -- COMMAND...``: run one service process and restart it whenever it exits.

`parley up` starts every process through this, the backbone included. For a service process (workers,
stages, gateway) the supervisor is the process `up` records (its pid file, its own session and process group),
the service runs as its child in the same group, writing to the same log. So `down` still stops everything
with one signal to the group (supervisor, service and, for a worker, vLLM's engine core).

For Redis, Kafka and Cassandra (``--pid-file``) the supervisor writes each child's pid to the service's own
pid file, which `status`, `down` and the fault tests read as before, and records itself in
``run/<name>.supervisor.pid``; `down` stops the supervisor, which stops the service and does not restart it.
A restarted backbone process finds its data as the dead one left it: Redis replays its append-only file
(a torn last write is dropped, ``aof-load-truncated``), Kafka recovers its log segments after an unclean
shutdown, Cassandra replays its commit log; none keeps a pid or lock file of its own that outlives it.

The log stays bounded (``trim_log``): past ``LOG_MAX_BYTES`` the supervisor copies it to ``<log>.1`` (dropping the
copy before) and truncates it, every process of the tree writing on where the file now ends (they append). A
broker that logs every group a load test makes grew its log to a gigabyte; no writer is stopped or reopened, and
only lines written between the copy and the truncation (microseconds) are lost.

When the child exits without the supervisor having been told to stop, it is started again after a
backoff (1 s, doubling to 30 s; back to 1 s once a run lasted a minute). Each restart is logged and
counted in ``<state>/run/<name>.restarts.json``, which `parley status` shows.

What a dead child leaves behind is killed before the restart. A SIGKILLed worker's vLLM engine core and its
worker process outlive it (reparented, holding the model and the KV cache: 3 GB here, the card's memory on a
GPU) beside the engine its restart loads. The supervisor is the child subreaper of its tree
(``PR_SET_CHILD_SUBREAPER``), so such orphans become its own children and it can find and stop them.
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import ctypes
import json
import os
import shutil
import signal
import stat
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from infra.config.settings import Settings
from infra.local.services.process import write_pid

FIRST_DELAY_S, MAX_DELAY_S, HEALTHY_AFTER_S = 1.0, 30.0, 60.0
LEFTOVER_GRACE_S = 5.0  # SIGTERM to what the dead child left, then SIGKILL
PR_SET_CHILD_SUBREAPER = 36
LOG_MAX_BYTES = 64 << 20  # a service's log is moved to <log>.1 past this (so at most twice this on disk)
LOG_CHECK_S = 30.0


def trim_log(fd: int = 1, max_bytes: int = LOG_MAX_BYTES) -> Path | None:
    """When ``fd`` (the log every process of the tree appends to) is a file past ``max_bytes``, copy it to
    ``<log>.1`` and truncate it; the path copied to, or None. The writers opened it to append (``process.start``),
    so each goes on at the file's new end; nothing is reopened."""
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode) or info.st_size <= max_bytes:
        return None
    path = Path(os.readlink(f"/proc/self/fd/{fd}"))
    if not path.is_absolute() or not path.exists():  # deleted, or not a path this process can name
        return None
    kept = path.with_name(path.name + ".1")
    with path.open("rb") as src, kept.open("wb") as dst:
        shutil.copyfileobj(src, dst, 1 << 20)  # to the end, what was appended during the copy included
        os.ftruncate(fd, 0)
    return kept


def become_subreaper() -> bool:
    """Orphans of the child's tree are reparented to this process instead of init (Linux only)."""
    try:
        return ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def children_of(pid: int) -> list[int]:
    found: list[int] = []
    with contextlib.suppress(OSError):
        for task in Path(f"/proc/{pid}/task").iterdir():
            with contextlib.suppress(OSError):
                found += [int(c) for c in (task / "children").read_text().split()]
    return found


def descendants(pid: int) -> list[int]:
    """Every process below ``pid``, from /proc (children first, then theirs)."""
    out, todo = [], children_of(pid)
    while todo:
        child = todo.pop(0)
        if child not in out:
            out.append(child)
            todo += children_of(child)
    return out


async def kill_leftovers(grace_s: float = LEFTOVER_GRACE_S) -> list[int]:
    """SIGTERM every process left below this one, SIGKILL those still there after ``grace_s``; reap them."""
    left = descendants(os.getpid())
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in left:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        deadline = time.monotonic() + grace_s
        while left and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
            left = [p for p in left if _alive_unreaped(p)]
        if not left:
            break
    return left


def _alive_unreaped(pid: int) -> bool:
    """False once ``pid`` has exited; reaps it if it is this process's child (an adopted orphan)."""
    with contextlib.suppress(ChildProcessError):
        done, _ = os.waitpid(pid, os.WNOHANG)
        if done == pid:
            return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}/status").exists() and "State:\tZ" not in _status(pid)


def _status(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return ""


@dataclass
class Restarts:
    restarts: int = 0
    last_exit: int | None = None
    last_restart_at: float | None = None
    child_pid: int | None = None


def restarts_file(state_dir: Path, name: str) -> Path:
    return state_dir / "run" / f"{name}.restarts.json"


def read_restarts(state_dir: Path, name: str) -> Restarts:
    try:
        return Restarts(**json.loads(restarts_file(state_dir, name).read_text()))
    except (OSError, ValueError, TypeError):
        return Restarts()


def next_delay(delay: float, ran_s: float) -> tuple[float, float]:
    """(this wait, the next one): doubling to the cap, back to the first after a healthy run."""
    if ran_s >= HEALTHY_AFTER_S:
        delay = FIRST_DELAY_S
    return delay, min(delay * 2, MAX_DELAY_S)


class Supervisor:
    def __init__(self, name: str, command: list[str], state_dir: Path, pid_file: Path | None = None) -> None:
        self.name, self.command, self.state_dir, self.pid_file = name, command, state_dir, pid_file
        self.record = Restarts()
        self.child: asyncio.subprocess.Process | None = None
        self.stopping = asyncio.Event()

    def say(self, text: str) -> None:
        stamp = time.strftime("%Y-%m-%d %H:%M:%S")
        print(f"----- parley supervisor {self.name} {stamp}: {text}", flush=True)

    def save(self) -> None:
        path = restarts_file(self.state_dir, self.name)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(asdict(self.record)))
        tmp.replace(path)

    def stop(self, sig: int) -> None:
        self.stopping.set()
        if self.child is not None and self.child.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self.child.send_signal(sig)

    async def trim_logs(self) -> None:
        while True:
            await asyncio.sleep(LOG_CHECK_S)
            try:
                if (kept := trim_log()) is not None:
                    self.say(f"log past {LOG_MAX_BYTES >> 20} MiB: the earlier lines are in {kept}")
            except OSError as exc:  # a full disk, a log removed by hand: the service runs on, the log unbounded
                self.say(f"could not trim the log: {exc}")

    async def run(self) -> int:
        trimming = asyncio.create_task(self.trim_logs())
        try:
            return await self._run()
        finally:
            trimming.cancel()

    async def _run(self) -> int:
        delay = FIRST_DELAY_S
        self.save()
        while True:
            began = time.monotonic()
            self.child = await asyncio.create_subprocess_exec(*self.command)  # same log, same process group
            self.record.child_pid = self.child.pid
            if self.pid_file is not None:
                write_pid(self.pid_file, self.child.pid)
            self.save()
            code = await self.child.wait()
            left = descendants(os.getpid())
            if left:
                self.say(f"{self.name} exited with {code}; stopping {len(left)} process(es) it left: "
                         f"{', '.join(map(str, left))}")
                if still := await kill_leftovers():
                    self.say(f"could not stop {', '.join(map(str, still))}")
            if self.stopping.is_set():
                return code
            wait_s, delay = next_delay(delay, time.monotonic() - began)
            self.record = Restarts(self.record.restarts + 1, code, time.time() + wait_s, None)
            self.save()
            self.say(f"{self.name} exited with {code} after {time.monotonic() - began:.0f} s; restart "
                     f"#{self.record.restarts} in {wait_s:.0f} s")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.stopping.wait(), wait_s)
            if self.stopping.is_set():
                return code


def add_arguments(parser: argparse.ArgumentParser, name: str) -> None:
    parser.add_argument("name", help="the service process's name (its pid file, log and restart count)")
    parser.add_argument("--pid-file", type=Path, help="write each child's pid here (Redis, Kafka, Cassandra)")
    parser.add_argument("child", nargs=argparse.REMAINDER, help="-- then the command to run and restart")


def run(args: argparse.Namespace) -> int:
    command = args.child[1:] if args.child[:1] == ["--"] else args.child
    if not command:
        print("parley supervise: give the command to run after --", file=sys.stderr)
        return 2
    return asyncio.run(_main(args.name, command, Settings.from_env().state_dir, args.pid_file))


async def _main(name: str, command: list[str], state_dir: Path, pid_file: Path | None = None) -> int:
    become_subreaper()
    supervisor = Supervisor(name, command, state_dir, pid_file)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, supervisor.stop, sig)
    return await supervisor.run()
