"""The local stack — Kafka (KRaft), Cassandra and Redis — as three processes that `parley up` starts
and owns.  Jars and the Maven repository live in ``settings.cache_dir``; config, data, logs and pid
files in ``settings.state_dir``; nothing in the repository.

    up(settings)      start what is not running (idempotent), then apply CQL migrations and topics
    down(settings)    stop the processes we started, and only those
    status(settings)  ask each service whether it answers, and its version
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from rich.console import Console

from infra.errors import StackError
from infra.services import java, process
from infra.services.base import Probe, Service
from infra.services.cassandra import Cassandra
from infra.services.kafka import Kafka
from infra.services.redis import Redis
from infra.settings import Settings

log = logging.getLogger(__name__)

START_TIMEOUT_S = 180.0  # Cassandra's cold start takes 15-90 s on 2 cores
STOP_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class ServiceStatus:
    name: str
    address: str
    version: str | None
    ok: bool
    detail: str
    pid: int | None = None  # the process `parley up` started; None when not ours or not running
    seconds: float | None = field(default=None, compare=False)  # time `up` spent getting it ready


def services(settings: Settings) -> list[Service]:
    return [Kafka(settings), Cassandra(settings), Redis(settings)]


@contextlib.contextmanager
def _lock(settings: Settings) -> Iterator[None]:
    """One `up`/`down` at a time per state folder, so two runs never both start a service."""
    path = settings.state_dir / "run" / "stack.lock"
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _say(console: Console | None, text: str) -> None:
    if console is not None:
        console.print(text)
    else:
        log.info(text)


def _status_of(
    service: Service, probe: Probe, detail: str = "", seconds: float | None = None
) -> ServiceStatus:
    pid = service.our_pid()
    owner = f"pid {pid}" if pid is not None else "not started by parley"
    text = "; ".join(part for part in (detail, probe.detail, owner) if part)
    return ServiceStatus(service.name, service.address, probe.version, probe.ok, text, pid, seconds)


# ------------------------------------------------------------------------------------------- up


def up(
    settings: Settings, console: Console | None = None, timeout: float = START_TIMEOUT_S
) -> list[ServiceStatus]:
    """Start every service that is not already answering, wait until all answer, then apply the CQL
    migrations and create the topics.  A second call reuses the running processes."""
    java.find_java17()  # fail before downloading anything
    stack = services(settings)
    for service in stack:
        service.install(console)

    with _lock(settings):
        # Decide for every service before starting any, so a port clash starts nothing.
        plan: dict[str, tuple[int | None, str]] = {}  # name -> (pid to watch, what we did)
        to_launch: list[Service] = []
        for service in stack:
            pid = service.our_pid() or _adopt(service)
            if pid is not None:
                plan[service.name] = (pid, "already running")
                continue
            process.remove_pid(service.pid_file)  # stale: that process is gone or not ours
            if service.busy_ports():
                if service.probe().ok:
                    plan[service.name] = (None, "already answering (not started by parley)")
                    continue
                service.ensure_ports_free()  # raises PortInUse naming the holder
            to_launch.append(service)
        for service in to_launch:
            began = time.monotonic()
            pid = service.launch()
            _say(console, f"{service.name}: starting (pid {pid}, log {service.log_file})")
            plan[service.name] = (pid, f"started (prepare {time.monotonic() - began:.1f} s)")

        def wait(service: Service) -> tuple[Probe, float]:
            return service.wait_ready(plan[service.name][0], timeout)

        results: dict[str, tuple[Probe, float]] = {}
        errors: list[StackError] = []
        with ThreadPoolExecutor(max_workers=len(stack)) as pool:
            futures = {s.name: pool.submit(wait, s) for s in stack}
            for service in stack:
                try:
                    results[service.name] = futures[service.name].result()
                    probe, waited = results[service.name]
                    _say(
                        console,
                        f"{service.name}: ready at {service.address} ({probe.version}) after {waited:.1f} s",
                    )
                except StackError as exc:
                    errors.append(exc)
        if errors:
            raise (
                errors[0]
                if len(errors) == 1
                else StackError(
                    f"{len(errors)} services failed to start", log_tail="\n\n".join(str(e) for e in errors)
                )
            )

    _post_start(settings, console)
    return [_status_of(s, results[s.name][0], plan[s.name][1], results[s.name][1]) for s in stack]


def _optional_step(label: str, module: str, attr: str, settings: Settings, console: Console | None) -> None:
    """Run ``module.attr(settings)``; skip, with a note, while that module is not written yet."""
    try:
        mod = __import__(module, fromlist=[attr])
        fn: Callable[[Settings], object] = getattr(mod, attr)
    except (ImportError, AttributeError) as exc:
        log.warning("%s skipped: not available yet (%s)", label, exc)
        _say(console, f"{label}: skipped: not available yet ({exc})")
        return
    began = time.monotonic()
    result = fn(settings)
    summary = ""
    if isinstance(result, dict):
        counts: dict[str, int] = {}
        for value in result.values():
            counts[str(value)] = counts.get(str(value), 0) + 1
        summary = ", ".join(f"{n} {k}" for k, n in sorted(counts.items()))
    elif isinstance(result, (list, tuple)):
        summary = f"{len(result)} applied"
    _say(console, f"{label}: done in {time.monotonic() - began:.1f} s" + (f" ({summary})" if summary else ""))


def _post_start(settings: Settings, console: Console | None) -> None:
    _optional_step("cql migrations", "infra.cql.migrate", "apply", settings, console)
    _optional_step("kafka topics", "topics.admin", "ensure_topics", settings, console)


# ------------------------------------------------------------------------------------------- down


def _adopt(service: Service) -> int | None:
    """A process of ours that lost its pid file gets the file back."""
    found = _orphans(service)
    if len(found) == 1:
        process.write_pid(service.pid_file, found[0])
        return found[0]
    return None


def _orphans(service: Service) -> list[int]:
    """Our processes that lost their pid file (same binary, working folder and command line)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            pid = int(entry.name)
            if process.is_ours(pid, exe_names=service.exe_names, cwd=service.cwd, markers=service.markers()):
                found.append(pid)
    return found


def down(settings: Settings, timeout: float = STOP_TIMEOUT_S) -> list[str]:
    """Stop the processes `parley up` started (SIGTERM, then SIGKILL after ``timeout``); one line per
    service saying what happened.  Data is kept."""
    stack = services(settings)
    with _lock(settings), ThreadPoolExecutor(max_workers=len(stack)) as pool:
        lines = list(pool.map(lambda s: s.stop(timeout), stack))
        for service in stack:
            for pid in _orphans(service):
                lines.append(f"{service.name}: {process.stop(pid, timeout)} (pid {pid}, had no pid file)")
    return lines


# ------------------------------------------------------------------------------------------- status


def status(settings: Settings) -> list[ServiceStatus]:
    stack = services(settings)
    with ThreadPoolExecutor(max_workers=len(stack)) as pool:
        probes = list(pool.map(lambda s: s.probe(timeout=5.0), stack))
    return [_status_of(s, p) for s, p in zip(stack, probes)]
