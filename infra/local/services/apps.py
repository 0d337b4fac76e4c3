"""The service's own processes, which `parley up` starts once the backbone answers: one generation
worker per engine pool, the stages process and the gateway.  Each runs in the background in its own
session and process group (so `down` can stop a worker together with vLLM's engine-core child), with
the same layout as the backbone services under ``settings.state_dir``::

    run/<name>.pid      pid of the process (also its process group and session id)
    run/<name>.json     what `up` started: command, readiness, port; `status` and `down` read it
    logs/<name>.log     its stdout and stderr, one banner line per start
    <name>/             its working directory (part of how we recognise the process as ours)

Names: ``worker-<pool>``, ``stages``, ``gateway``, and ``prometheus`` with ``up --with-prometheus``.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from infra.config.settings import Settings, env_var
from infra.local.errors import ServiceFailed
from infra.local.services import process

WORKER_READY = "worker ready"  # the worker prints `worker ready pool=<name>`
STAGES_READY = "stages ready"
WORKER_TIMEOUT_S = 300.0  # engine load takes 25-60 s on a CPU, longer with two loading at once
STAGES_TIMEOUT_S = 180.0
GATEWAY_TIMEOUT_S = 90.0
STOP_TIMEOUT_S = 20.0
SUBCOMMANDS = {"worker": "worker", "stages": "stages", "gateway": "gateway"}  # kind -> `parley` subcommand


@dataclass(frozen=True)
class AppSpec:
    """One service process: how to start it and how to tell that it is ready."""

    name: str
    kind: str  # "worker", "stages" or "gateway"
    command: tuple[str, ...]
    markers: tuple[str, ...]  # words that must appear in its command line
    ready_log: str | None = None  # a line containing this in its log means ready
    ready_url: str | None = None  # ... or this URL answering 200
    port: int | None = None
    metrics_port: int | None = None  # where its /metrics answers (the gateway: its HTTP port)
    timeout: float = 120.0
    env: dict[str, str] = field(default_factory=dict, compare=False)

    def to_json(self) -> dict[str, object]:
        data = dataclasses.asdict(self)
        data.pop("env")
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, object]) -> AppSpec:
        known = {f.name for f in dataclasses.fields(cls)} - {"env"}
        values: dict[str, Any] = {k: v for k, v in data.items() if k in known}  # as read back from JSON
        values["command"] = tuple(values.get("command") or ())
        values["markers"] = tuple(values.get("markers") or ())
        return cls(**values)


# ------------------------------------------------------------------ what to start


def parley_command(*args: str, executable: str | None = None) -> list[str]:
    """``parley ARGS`` with this virtual environment's ``parley`` (the interpreter's sibling), or
    ``python -m infra.local.cli ARGS`` where that script is not installed."""
    python = Path(executable or sys.executable)
    script = python.with_name("parley")
    if script.is_file() and os.access(script, os.X_OK):
        return [str(script), *args]
    return [str(python), "-m", "infra.local.cli", *args]


def supervised(name: str, args: tuple[str, ...], executable: str | None = None) -> tuple[str, ...]:
    """``parley supervise NAME -- parley ARGS``: the process restarted whenever it exits
    (``infra/local/supervisor.py``); the supervisor's command line still carries ``args`` as markers."""
    return tuple(parley_command("supervise", name, "--", *parley_command(*args, executable=executable),
                                executable=executable))


def worker_name(pool: str) -> str:
    return f"worker-{pool}"


def gateway_url(settings: Settings, path: str = "/") -> str:
    return f"http://{settings.host}:{settings.ports.gateway}{path}"


def specs(
    settings: Settings, pools: Iterable[str] | Mapping[str, int], *, workers: bool = True,
    executable: str | None = None
) -> list[AppSpec]:
    """The processes `parley up` starts: a worker per pool (unless ``workers`` is False), the stages
    process and the gateway, in that order. ``pools`` may map each pool to its worker's metrics port."""
    found: list[AppSpec] = []
    ports = dict(pools) if isinstance(pools, Mapping) else {}
    if workers:
        for pool in pools:
            args = ("worker", "--pool", pool)
            found.append(
                AppSpec(
                    name=worker_name(pool),
                    kind="worker",
                    command=supervised(worker_name(pool), args, executable),
                    markers=args,
                    ready_log=WORKER_READY,
                    metrics_port=ports.get(pool) or None,
                    timeout=WORKER_TIMEOUT_S,
                )
            )
    found.append(
        AppSpec(
            name="stages",
            kind="stages",
            command=supervised("stages", ("stages",), executable),
            markers=("stages",),
            ready_log=STAGES_READY,
            metrics_port=settings.ports.stages_metrics or None,
            timeout=STAGES_TIMEOUT_S,
        )
    )
    found.extend(gateway_specs(settings, executable))
    return found


def gateway_specs(settings: Settings, executable: str | None = None) -> list[AppSpec]:
    """One gateway on the gateway port; or, with ``gateway_count`` N > 1, gateways ``gateway-0`` ..
    ``gateway-<N-1>`` on the ports after it, each told its index (the partitions of chat.tokens it tails),
    for the load balancer on the gateway port to spread requests over (``infra/local/balancer.py``)."""
    count = settings.gateway_count
    found = []
    for index in range(count):
        port = settings.ports.gateway + (1 + index if count > 1 else 0)
        name = f"gateway-{index}" if count > 1 else "gateway"
        args = ("gateway", "--port", str(port))
        found.append(AppSpec(
            name=name, kind="gateway", command=supervised(name, args, executable), markers=args,
            ready_url=f"http://{settings.host}:{port}/healthz", port=port, metrics_port=port,
            timeout=GATEWAY_TIMEOUT_S,
            env={env_var("GATEWAY_INDEX"): str(index), env_var("GATEWAYS"): str(count)} if count > 1 else {}))
    return found


def balancer_spec(settings: Settings, command: tuple[str, ...]) -> AppSpec:
    """HAProxy on the gateway port in front of several gateways (infra/local/balancer.py writes its config)."""
    return AppSpec(name="balancer", kind="balancer", command=command, markers=command[-1:],
                   ready_url=gateway_url(settings, "/healthz"), port=settings.ports.gateway, timeout=GATEWAY_TIMEOUT_S)


def prometheus_spec(settings: Settings, command: tuple[str, ...]) -> AppSpec:
    """Prometheus, scraping every process above (infra/local/prometheus.py writes its config)."""
    port = settings.ports.prometheus
    return AppSpec(name="prometheus", kind="prometheus", command=command, markers=("--config.file=",),
                   ready_url=f"http://{settings.host}:{port}/-/ready", port=port, timeout=GATEWAY_TIMEOUT_S)


def missing_subcommands(wanted: Iterable[AppSpec], commands: Mapping[str, object] | None = None) -> list[str]:
    """`parley` subcommands these processes need that ``infra/local/cli.py`` does not register."""
    if commands is None:
        from infra.local.cli import COMMANDS

        commands = COMMANDS
    return sorted({SUBCOMMANDS[s.kind] for s in wanted if s.kind in SUBCOMMANDS} - set(commands))


def stop_tiers(names: Iterable[str]) -> list[list[str]]:
    """The order `down` stops service processes in: the gateways and their balancer (no new requests), then the stages,
    then every worker at once; anything else last."""
    rank = {"balancer": 0, "gateway": 0, "stages": 1}
    tiers: dict[int, list[str]] = {}
    for name in sorted(set(names)):
        tier = rank.get(name.split("-")[0] if name.startswith("gateway-") else name,
                        2 if name.startswith("worker-") else 3)
        tiers.setdefault(tier, []).append(name)
    return [tiers[k] for k in sorted(tiers)]


# ------------------------------------------------------------------ readiness


def last_banner_offset(path: Path, name: str | None = None, chunk: int = 1 << 20) -> int:
    """Byte offset of the latest start banner in a log (0 when none), read from the end backwards."""
    needle = process.START_BANNER.encode() + (f" {name} at ".encode() if name else b"")
    try:
        with path.open("rb") as fh:
            size = end = fh.seek(0, os.SEEK_END)
            while end > 0:
                begin = max(0, end - chunk)
                fh.seek(begin)
                # overlap the later window by one needle, so a banner split between windows is found
                data = fh.read(min(size, end + len(needle)) - begin)
                at = data.rfind(needle)
                if at >= 0:
                    return begin + at
                end = begin
    except OSError:
        pass
    return 0


class LogWatch:
    """Reads a log forward from ``offset``, only new bytes at each call, looking for a line."""

    def __init__(self, path: Path, offset: int = 0) -> None:
        self.path, self.offset = path, offset
        self._partial = b""
        self._found: set[str] = set()

    @classmethod
    def since_last_start(cls, path: Path, name: str | None = None) -> LogWatch:
        return cls(path, last_banner_offset(path, name))

    def seen(self, fragment: str) -> bool:
        if fragment in self._found:
            return True
        try:
            with self.path.open("rb") as fh:
                if os.fstat(fh.fileno()).st_size < self.offset:  # trimmed by its supervisor: read it anew
                    self.offset, self._partial = 0, b""
                fh.seek(self.offset)
                data = fh.read()
        except OSError:
            return False
        self.offset += len(data)
        lines = (self._partial + data).split(b"\n")
        self._partial = lines.pop()  # an unfinished last line is read again next time
        needle = fragment.encode()
        if any(needle in line for line in lines) or needle in self._partial:
            self._found.add(fragment)
            return True
        return False


def http_ok(url: str, timeout: float = 2.0) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return bool(response.status == 200)
    except (urllib.error.URLError, OSError, ValueError):
        return False


# ------------------------------------------------------------------ one process


class App:
    """A service process of ours: start, recognise, wait for, stop (with its whole process group)."""

    def __init__(self, spec: AppSpec, settings: Settings) -> None:
        self.spec, self.settings = spec, settings

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def pid_file(self) -> Path:
        return self.settings.state_dir / "run" / f"{self.name}.pid"

    @property
    def record_file(self) -> Path:
        return self.settings.state_dir / "run" / f"{self.name}.json"

    @property
    def log_file(self) -> Path:
        return self.settings.state_dir / "logs" / f"{self.name}.log"

    @property
    def cwd(self) -> Path:
        return self.settings.state_dir / self.name

    @property
    def exe_names(self) -> tuple[str, ...]:
        if self.spec.kind == "prometheus":  # a binary of its own, not one of ours
            return (Path(os.path.realpath(self.spec.command[0])).name,)
        # `parley` is a script; the kernel reports the interpreter from its #! line, this one.
        return (Path(os.path.realpath(sys.executable)).name, Path(sys.executable).name)

    @classmethod
    def recorded(cls, settings: Settings) -> list[App]:
        """The processes `up` started (their records), whatever the configuration says now."""
        found = []
        for path in sorted((settings.state_dir / "run").glob("*.json")):
            try:
                spec = AppSpec.from_json(json.loads(path.read_text()))
            except (OSError, ValueError, TypeError):
                continue
            if spec.name == path.stem:
                found.append(cls(spec, settings))
        return found

    def our_pid(self) -> int | None:
        pid = process.read_pid(self.pid_file)
        if pid is not None and process.is_ours(
            pid, exe_names=self.exe_names, cwd=self.cwd, markers=self.spec.markers
        ):
            return pid
        return None

    def port_busy(self) -> bool:
        return self.spec.port is not None and not process.port_free(self.settings.host, self.spec.port)

    def launch(self) -> tuple[int, LogWatch]:
        """Start the process; return its pid and a watch on its log from this start on."""
        self.record_file.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.record_file.with_name(self.record_file.name + ".tmp")
        tmp.write_text(json.dumps({**self.spec.to_json(), "started_at": time.time()}, indent=1) + "\n")
        os.replace(tmp, self.record_file)
        offset = self.log_file.stat().st_size if self.log_file.exists() else 0
        env = {**self.settings.to_env(), "PYTHONUNBUFFERED": "1", **self.spec.env}
        pid = process.start(
            self.name,
            list(self.spec.command),
            log_file=self.log_file,
            pid_file=self.pid_file,
            cwd=self.cwd,
            env=env,
        )
        return pid, LogWatch(self.log_file, offset)

    def is_ready(self, watch: LogWatch | None = None) -> bool:
        if self.spec.ready_url is not None and not http_ok(self.spec.ready_url):
            return False
        if self.spec.ready_log is not None:
            watch = watch or LogWatch.since_last_start(self.log_file, self.name)
            return watch.seen(self.spec.ready_log)
        return True

    def wait_ready(self, pid: int | None, watch: LogWatch | None = None, timeout: float | None = None) -> float:
        watch = watch or LogWatch.since_last_start(self.log_file, self.name)
        try:
            return process.wait_until_ready(
                self.name,
                lambda: self.is_ready(watch),
                pid=pid,
                log_file=self.log_file,
                timeout=self.spec.timeout if timeout is None else timeout,
            )
        except ServiceFailed as exc:
            if "did not become ready" not in exc.message:
                raise
            what = f"the line {self.spec.ready_log!r}" if self.spec.ready_log else self.spec.ready_url
            hint = f"read {self.log_file}; `parley down --keep-backbone` stops it"
            if self.spec.kind == "worker":
                hint += "; a slow machine may need `parley up --worker-timeout` raised"
            raise ServiceFailed(
                f"{exc.message} (waiting for {what}); it is still running",
                hint=hint,
                log_tail=exc.log_tail,
            ) from None

    def stop(self, timeout: float = STOP_TIMEOUT_S) -> str | None:
        """Stop our process and its process group; forget the record.  None when `up` never started
        it (no pid file and no record)."""
        pid = process.read_pid(self.pid_file)
        had_record = self.record_file.exists()
        try:
            if pid is None:
                return f"{self.name}: not running (no pid file)" if had_record else None
            if self.our_pid() == pid:
                return f"{self.name}: {process.stop_group(pid, timeout)} (pid {pid} and its process group)"
            if process.is_alive(pid):
                return f"{self.name}: pid {pid} is not our {self.name} process; left it alone"
            leftovers = process.group_members(pid)
            if leftovers:  # the leader is gone, its children (e.g. vLLM's engine core) are not
                how = process.stop_group(pid, timeout)
                return f"{self.name}: {how} {len(leftovers)} leftover child process(es) of pid {pid}"
            return f"{self.name}: not running (removed stale pid file, pid {pid})"
        finally:
            process.remove_pid(self.pid_file)
            self.record_file.unlink(missing_ok=True)
