"""What the three services have in common: where their files live, how we know a process is ours,
and start / wait / stop on top of :mod:`infra.local.services.process`.

Layout under ``settings.state_dir``::

    run/<name>.pid                 pid of the service process (rewritten by its supervisor at each restart)
    run/<name>.supervisor.pid      pid of its supervisor (`parley supervise`), which restarts it when it exits
    run/<name>.restarts.json       the supervisor's restart count and the current child's pid
    logs/<name>.log                its stdout and stderr, one banner line per start
    <name>/                        its config and data; the process's working directory
"""

from __future__ import annotations

import os
import signal
import sys
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from rich.console import Console

from infra.config.settings import Settings, env_var
from infra.local.errors import PortInUse, ServiceFailed
from infra.local.services import process


@dataclass(frozen=True)
class Probe:
    ok: bool
    version: str | None = None
    detail: str = ""


class Service(ABC):
    name: str  # a class attribute, or per instance (Kafka's nodes)
    exe_names: ClassVar[tuple[str, ...]]

    def __init__(self, settings: Settings) -> None:
        self.settings = settings

    # ------------------------------------------------------------ where things are
    @property
    def home(self) -> Path:
        return self.settings.state_dir / self.name

    @property
    def cwd(self) -> Path:
        """The process's working directory, part of how we recognise it as ours."""
        return self.home

    @property
    def pid_file(self) -> Path:
        return self.settings.state_dir / "run" / f"{self.name}.pid"

    @property
    def supervisor_pid_file(self) -> Path:
        return self.settings.state_dir / "run" / f"{self.name}.supervisor.pid"

    @property
    def log_file(self) -> Path:
        return self.settings.state_dir / "logs" / f"{self.name}.log"

    @property
    @abstractmethod
    def port(self) -> int: ...

    @property
    def ports(self) -> dict[str, int]:
        """Every port the service binds; all must be free before it starts."""
        return {"client": self.port}

    @property
    def address(self) -> str:
        return f"{self.settings.host}:{self.port}"

    def markers(self) -> list[str]:
        """Words that must appear in our process's command line."""
        return []

    # ------------------------------------------------------------ to implement
    def install(self, console: Console | None = None) -> None:  # noqa: B027 - an optional hook
        """Download or install what the service runs (once)."""

    def prepare(self) -> None:  # noqa: B027 - an optional hook
        """Write config files and initialise storage before a start."""

    @abstractmethod
    def command(self) -> list[str]: ...

    @abstractmethod
    def probe(self, timeout: float = 3.0) -> Probe:
        """Ask the service itself whether it answers, and its version."""

    def version_hint(self) -> str | None:
        """A version known without asking the service (e.g. from its log), for services whose
        protocol does not report one."""
        return None

    # ------------------------------------------------------------ process handling
    def our_pid(self) -> int | None:
        """The pid from our pid file when that process is alive and provably ours."""
        pid = process.read_pid(self.pid_file)
        if pid is not None and process.is_ours(
            pid, exe_names=self.exe_names, cwd=self.cwd, markers=self.markers()
        ):
            return pid
        return None

    def busy_ports(self) -> dict[str, int]:
        return {
            role: port for role, port in self.ports.items() if not process.port_free(self.settings.host, port)
        }

    def ensure_ports_free(self) -> None:
        busy = self.busy_ports()
        if busy:
            role, port = next(iter(busy.items()))
            raise PortInUse(
                f"{self.name}: port {port} ({role}) on {self.settings.host} is in use by "
                f"{process.describe_holders(port)}, which `parley up` did not start",
                hint=f"stop that process, or choose another port ({env_var(self.name.upper() + '_PORT')} etc.)",
            )

    def supervisor_pid(self) -> int | None:
        """The pid of this service's supervisor when it is alive and provably ours."""
        pid = process.read_pid(self.supervisor_pid_file)
        python = (Path(os.path.realpath(sys.executable)).name, Path(sys.executable).name)
        if pid is not None and process.is_ours(pid, exe_names=python, cwd=self.cwd,
                                               markers=["supervise", str(self.pid_file)]):
            return pid
        return None

    def launch(self) -> int:
        """Start the service under `parley supervise` (restarted whenever it exits); return the supervisor's
        pid. The supervisor writes the service's own pid to ``pid_file``."""
        from infra.local.services.apps import parley_command
        from infra.local.supervisor import restarts_file

        self.prepare()
        process.remove_pid(self.pid_file)
        restarts_file(self.settings.state_dir, self.name).unlink(missing_ok=True)  # counted from this start
        supervise = parley_command("supervise", "--pid-file", str(self.pid_file), self.name, "--", *self.command())
        return process.start(self.name, supervise, log_file=self.log_file, pid_file=self.supervisor_pid_file,
                             cwd=self.cwd, env=self.settings.to_env())

    def wait_ready(self, pid: int | None, timeout: float) -> tuple[Probe, float]:
        """Until the service answers; ``pid``: its supervisor (or the service), which must stay alive. A
        service that exits during start-up fails this at once rather than being restarted until the timeout."""
        from infra.local.supervisor import read_restarts

        last: list[Probe] = []
        supervised = pid is not None and pid == self.supervisor_pid()
        before = read_restarts(self.settings.state_dir, self.name).restarts

        def check() -> bool:
            if supervised and read_restarts(self.settings.state_dir, self.name).restarts > before:
                raise ServiceFailed(f"{self.name} exited during start-up", hint=f"read {self.log_file}",
                                    log_tail=process.tail(self.log_file))
            result = self.probe(timeout=3.0)
            last[:] = [result]
            return result.ok

        waited = process.wait_until_ready(self.name, check, pid=pid, log_file=self.log_file, timeout=timeout)
        return last[0], waited

    def stop_supervisor(self, timeout: float) -> str | None:
        """Stop the supervisor, which stops the service (SIGTERM) and does not restart it; the service is
        killed after ``timeout``. None when there is no supervisor of ours."""
        pid = self.supervisor_pid()
        if pid is None:
            process.remove_pid(self.supervisor_pid_file)
            return None
        child = self.our_pid()
        process.signal_pid(pid, signal.SIGTERM)
        how = "stopped"
        if process.wait_gone([pid], timeout):
            how = "killed"
            if child is not None:
                process.signal_pid(child, signal.SIGKILL)  # the supervisor exits once its child has
            if process.wait_gone([pid], 10.0):
                process.stop(pid, 5.0)
        if child is not None and process.is_alive(child):
            how = process.stop(child, 10.0)
        process.remove_pid(self.supervisor_pid_file)
        process.remove_pid(self.pid_file)
        return f"{self.name}: {how} with its supervisor (pid {child or '-'}, supervisor {pid})"

    def stop(self, timeout: float = 60.0) -> str:
        """Stop our process (with its supervisor) if there is one; never touch a process we cannot prove we
        started."""
        supervised = self.stop_supervisor(timeout)
        if supervised is not None:
            return supervised
        pid = process.read_pid(self.pid_file)
        if pid is None:
            return f"{self.name}: not running (no pid file)"
        if not process.is_alive(pid):
            process.remove_pid(self.pid_file)
            return f"{self.name}: not running (removed stale pid file, pid {pid})"
        if self.our_pid() != pid:
            process.remove_pid(self.pid_file)
            return (
                f"{self.name}: pid {pid} is not our {self.name} process; left it alone, removed the pid file"
            )
        how = process.stop(pid, timeout)
        process.remove_pid(self.pid_file)
        return f"{self.name}: {how} (pid {pid})"
