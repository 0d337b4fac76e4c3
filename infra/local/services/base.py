"""What the three services have in common: where their files live, how we know a process is ours,
and start / wait / stop on top of :mod:`infra.local.services.process`.

Layout under ``settings.state_dir``::

    run/<name>.pid      pid of the process `parley up` started
    logs/<name>.log     its stdout and stderr, one banner line per start
    <name>/             its config and data; the process's working directory
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from rich.console import Console

from infra.config.settings import Settings, env_var
from infra.local.errors import PortInUse
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

    def launch(self) -> int:
        self.prepare()
        return process.start(
            self.name, self.command(), log_file=self.log_file, pid_file=self.pid_file, cwd=self.cwd
        )

    def wait_ready(self, pid: int | None, timeout: float) -> tuple[Probe, float]:
        last: list[Probe] = []

        def check() -> bool:
            result = self.probe(timeout=3.0)
            last[:] = [result]
            return result.ok

        waited = process.wait_until_ready(self.name, check, pid=pid, log_file=self.log_file, timeout=timeout)
        return last[0], waited

    def stop(self, timeout: float = 60.0) -> str:
        """Stop our process if there is one; never touch a process we cannot prove we started."""
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
