"""The local stack — Kafka (KRaft), Cassandra and Redis — as three processes that `parley up` starts
and owns, and on top of it the service's own processes (a generation worker per pool, the stages
process, the gateway; see :mod:`infra.local.services.apps`).  Jars and the Maven repository live in
``settings.cache_dir``; config, data, logs and pid files in ``settings.state_dir``; nothing in the
repository.

    up(settings)          the backbone only: start what is not running (idempotent), then apply CQL
                          migrations and topics (what the test suite uses)
    up_service(settings)  the backbone, then workers, stages and gateway, then the demo user
    down(settings)        stop the service processes, then the backbone; only processes we started
    status(settings)      ask each backbone service whether it answers, and its version
    status_apps(settings) each service process: running or not, pid, port
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import fcntl
import json
import logging
import os
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from rich.console import Console

from infra.config.pools import PoolConfigError, load_pools
from infra.config.settings import POOL_PREFIX, Settings, env_var
from infra.local import topology
from infra.local.errors import PortInUse, StackError
from infra.local.services import apps, java, kafka, process
from infra.local.services.apps import App, AppSpec, LogWatch
from infra.local.services.base import Probe, Service
from infra.local.services.cassandra import Cassandra
from infra.local.services.kafka import Kafka
from infra.local.services.redis import Redis
from infra.stores.cql import migrate

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
    brokers = [Kafka(settings, node) for node in range(1, settings.kafka_brokers + 1)]
    return [*brokers, Cassandra(settings), Redis(settings)]


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
    if service.supervisor_pid() is not None:
        owner += f", supervised{restarted(service.settings, service.name)}"
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
        plan, to_launch = _decide(stack)
        for service in to_launch:
            began = time.monotonic()
            pid = service.launch()
            _say(console, f"{service.name}: starting (pid {pid}, log {service.log_file})")
            plan[service.name] = (pid, f"started (prepare {time.monotonic() - began:.1f} s)")
        results = _wait_ready(stack, plan, to_launch, timeout, console)

    _post_start(settings, console)
    return [_status_of(s, results[s.name][0], plan[s.name][1], results[s.name][1]) for s in stack]


def _decide(stack: list[Service]) -> tuple[dict[str, tuple[int | None, str]], list[Service]]:
    """For every service before starting any, so a port clash starts nothing: name -> (pid to watch, what we
    did) for those already running, and the services to launch."""
    plan: dict[str, tuple[int | None, str]] = {}
    to_launch: list[Service] = []
    for service in stack:
        pid = service.our_pid() or _adopt(service)
        supervisor = service.supervisor_pid()
        if pid is not None:
            plan[service.name] = (supervisor or pid, "already running" if supervisor else
                                  "already running, unsupervised (`parley down` then `up` supervises it)")
            continue
        if supervisor is not None:  # it died and its supervisor is starting it again
            plan[service.name] = (supervisor, "being restarted by its supervisor")
            continue
        process.remove_pid(service.pid_file)  # stale: that process is gone or not ours
        if service.busy_ports():
            if service.probe().ok:
                plan[service.name] = (None, "already answering (not started by parley)")
                continue
            service.ensure_ports_free()  # raises PortInUse naming the holder
        to_launch.append(service)
    return plan, to_launch


def _wait_ready(stack: list[Service], plan: dict[str, tuple[int | None, str]], to_launch: list[Service],
                timeout: float, console: Console | None) -> dict[str, tuple[Probe, float]]:
    """Each service's probe and wait once it answers, all waited for at once; any that fails fails `up` (and a
    service it launched is no longer restarted)."""

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
                if service in to_launch:
                    service.stop_supervisor(10.0)  # `up` failed: nothing goes on restarting it
    if errors:
        _fail(errors, "services failed to start")
    return results


def _step(label: str, fn: Callable[[Settings], object], settings: Settings, console: Console | None) -> None:
    """Run ``fn(settings)`` and say how long it took and what it changed."""
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
    if settings.kafka_brokers > 1:
        _step("kafka brokers registered", kafka.wait_for_brokers, settings, console)
    _step("cql migrations", migrate.apply, settings, console)
    _step("kafka topics", topology.ensure_topics, settings, console)


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


def down(
    settings: Settings,
    timeout: float = STOP_TIMEOUT_S,
    *,
    keep_backbone: bool = False,
    app_timeout: float = apps.STOP_TIMEOUT_S,
) -> list[str]:
    """Stop the service processes `parley up` started (gateway, then stages, then the workers; each
    with its process group, SIGKILL after ``app_timeout``), then, unless ``keep_backbone``, the
    backbone (SIGTERM, then SIGKILL after ``timeout``); one line per process saying what happened.
    Data is kept."""
    stack = services(settings)
    with _lock(settings):
        lines = _stop_apps(settings, app_timeout)
        if keep_backbone:
            return lines
        with ThreadPoolExecutor(max_workers=len(stack)) as pool:
            lines += list(pool.map(lambda s: s.stop(timeout), stack))
        for service in stack:
            for pid in _orphans(service):
                lines.append(f"{service.name}: {process.stop(pid, timeout)} (pid {pid}, had no pid file)")
    return lines


# ------------------------------------------------------------------------------------------- status


def status(settings: Settings) -> list[ServiceStatus]:
    stack = services(settings)
    with ThreadPoolExecutor(max_workers=len(stack)) as pool:
        probes = list(pool.map(lambda s: s.probe(timeout=5.0), stack))
    return [_status_of(s, p) for s, p in zip(stack, probes, strict=True)]


# ------------------------------------------------------------------------------------------- the service


@dataclass(frozen=True)
class ProcessStatus:
    name: str
    pid: int | None  # ours, alive; None otherwise
    port: int | None
    running: bool  # ours and alive, or (gateway) answering though not ours
    ready: bool
    started_by_up: bool  # `up` left a record of starting it and `down` has not stopped it since
    detail: str
    log_file: Path
    seconds: float | None = field(default=None, compare=False)
    metrics_port: int | None = None


@dataclass(frozen=True)
class DemoUser:
    user_id: str
    plan: str
    token: str
    keyspace: str
    created_at: str


@dataclass(frozen=True)
class ServiceReport:
    backbone: list[ServiceStatus]
    processes: list[ProcessStatus]
    demo: DemoUser | None
    demo_is_new: bool
    url: str
    docs_url: str


def app_specs(settings: Settings, *, workers: bool = True, with_prometheus: bool = False) -> list[AppSpec]:
    """The service processes for the current configuration: a worker per pool in ``load_pools``, and
    Prometheus scraping all of them when asked."""
    pools: dict[str, int] = {}
    if workers or with_prometheus:
        try:
            pools = {name: cfg.metrics_port for name, cfg in load_pools(settings).items()}
        except PoolConfigError as exc:
            raise StackError(
                f"engine pools: {exc}",
                hint=f"fix {settings.pools_file} or the {env_var(POOL_PREFIX)}* variable it names; "
                "or start without workers: `parley up --no-workers`",
            ) from exc
    found = apps.specs(settings, pools, workers=workers)
    if settings.gateway_count > 1:
        from infra.local import balancer

        found.append(apps.balancer_spec(settings, balancer.command(balancer.install(),
                                                                   balancer.write_config(settings))))
    if with_prometheus:
        from infra.local import prometheus

        config = prometheus.write_config(settings, pools if workers else {})
        found.append(apps.prometheus_spec(settings, prometheus.command(prometheus.install(), settings, config)))
    return found


def _known_apps(settings: Settings) -> dict[str, App]:
    """What `up` recorded starting, plus what the configuration would start."""
    known = {app.name: app for app in App.recorded(settings)}
    try:
        configured = app_specs(settings)
    except StackError:
        configured = apps.specs(settings, [], workers=False)
    for spec in configured:
        known.setdefault(spec.name, App(spec, settings))
    return known


def start_apps(
    settings: Settings, wanted: list[AppSpec], console: Console | None = None
) -> list[ProcessStatus]:
    """Start each process in ``wanted`` that is not running (each in its own session and process
    group), then wait for all of them at once until ready.  Processes already running are reused."""
    procs = [App(spec, settings) for spec in wanted]
    with _lock(settings):
        plan, to_launch = _decide_apps(settings, procs)
        for app in to_launch:
            pid, watch = app.launch()
            _say(console, f"{app.name}: starting (pid {pid}, log {app.log_file})")
            plan[app.name] = (pid, "started", watch)
        waited = _wait_apps(procs, plan, console)

    return [
        ProcessStatus(
            app.name,
            plan[app.name][0],
            app.spec.port,
            True,
            True,
            app.record_file.exists(),
            f"{plan[app.name][1]}; log {app.log_file}",
            app.log_file,
            waited[app.name],
            app.spec.metrics_port,
        )
        for app in procs
    ]


_AppPlan = dict[str, tuple[int | None, str, LogWatch | None]]  # name -> (pid to watch, what we did, its log watch)


def _decide_apps(settings: Settings, procs: list[App]) -> tuple[_AppPlan, list[App]]:
    """The processes already running (or answering), and those to launch; a port held by a process `up` did
    not start fails it."""
    plan: _AppPlan = {}
    to_launch: list[App] = []
    for app in procs:
        pid = app.our_pid()
        if pid is not None:
            plan[app.name] = (pid, "already running", None)
            continue
        if process.read_pid(app.pid_file) is not None:
            app.stop()  # a stale pid file; kills leftover children of a crashed worker
        if app.port_busy():
            if app.spec.ready_url is not None and apps.http_ok(app.spec.ready_url):
                plan[app.name] = (None, "already answering (not started by parley)", None)
                continue
            raise PortInUse(
                f"{app.name}: port {app.spec.port} on {settings.host} is in use by "
                f"{process.describe_holders(app.spec.port or 0)}, which `parley up` did not start",
                hint=f"stop that process, or choose another port ({env_var(app.spec.kind.upper() + '_PORT')})",
            )
        to_launch.append(app)
    return plan, to_launch


def _wait_apps(procs: list[App], plan: _AppPlan, console: Console | None) -> dict[str, float]:
    """Each process's seconds until ready, all waited for at once; any that fails fails the start."""

    def wait(app: App) -> float:
        pid, _, watch = plan[app.name]
        return app.wait_ready(pid, watch)

    waited: dict[str, float] = {}
    errors: list[StackError] = []
    with ThreadPoolExecutor(max_workers=max(1, len(procs))) as pool:
        futures = {app.name: pool.submit(wait, app) for app in procs}
        for app in procs:
            try:
                waited[app.name] = futures[app.name].result()
                where = f" on port {app.spec.port}" if app.spec.port else ""
                _say(console, f"{app.name}: ready{where} after {waited[app.name]:.1f} s")
            except StackError as exc:
                errors.append(exc)
    if errors:
        _fail(errors, "service processes failed to start; `parley down` stops the others")
    return waited


def _fail(errors: list[StackError], summary: str) -> None:
    if len(errors) == 1:
        raise errors[0]
    raise StackError(f"{len(errors)} {summary}", log_tail="\n\n".join(str(e) for e in errors))


def stop_apps(settings: Settings, timeout: float = apps.STOP_TIMEOUT_S) -> list[str]:
    with _lock(settings):
        return _stop_apps(settings, timeout)


def _stop_apps(settings: Settings, timeout: float) -> list[str]:
    known = _known_apps(settings)
    lines: list[str] = []
    for tier in apps.stop_tiers(known):
        with ThreadPoolExecutor(max_workers=len(tier)) as pool:
            lines += [line for line in pool.map(lambda n: known[n].stop(timeout), tier) if line]
    return lines


def restarted(settings: Settings, name: str) -> str:
    """", restarted N times (last exit C)" from the process's supervisor, or nothing."""
    from infra.local.supervisor import read_restarts

    record = read_restarts(settings.state_dir, name)
    return f", restarted {record.restarts} times (last exit {record.last_exit})" if record.restarts else ""


def status_apps(settings: Settings) -> list[ProcessStatus]:
    """Each service process, configured or recorded: whether it runs, its pid and port, and whether
    it is ready yet."""
    found = []
    for app in _known_apps(settings).values():
        pid = app.our_pid()
        recorded = app.record_file.exists()
        if pid is not None:
            ready = app.is_ready()
            detail = f"{'ready' if ready else 'starting'}{restarted(settings, app.name)}; log {app.log_file}"
            found.append(ProcessStatus(app.name, pid, app.spec.port, True, ready, recorded, detail, app.log_file,
                                       metrics_port=app.spec.metrics_port))
            continue
        answering = app.spec.ready_url is not None and app.port_busy() and apps.http_ok(app.spec.ready_url)
        if answering:
            detail = "answering, but not started by parley"
        elif recorded:
            detail = f"exited; read {app.log_file}"
        else:
            detail = "not started (`parley up` starts it)"
        found.append(
            ProcessStatus(app.name, None, app.spec.port, answering, answering, recorded, detail, app.log_file,
                          metrics_port=app.spec.metrics_port)
        )
    order = {"worker": 0, "stages": 1, "gateway": 2, "balancer": 2, "prometheus": 3}
    return sorted(found, key=lambda p: (order.get(p.name.split("-")[0], 3), p.name))


# ------------------------------------------------------------------------------------------- demo user


def demo_file(settings: Settings) -> Path:
    return settings.state_dir / "demo-user.json"


def load_demo_user(path: Path) -> DemoUser | None:
    try:
        data = json.loads(path.read_text())
        return DemoUser(**{k: str(data[k]) for k in ("user_id", "plan", "token", "keyspace", "created_at")})
    except (OSError, ValueError, KeyError, TypeError):
        return None


def save_demo_user(path: Path, user: DemoUser) -> None:
    """Write readable by its owner only (it holds a bearer token), atomically."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.fchmod(fd, 0o600)  # whatever the umask or an older file said
        os.write(fd, (json.dumps(user.__dict__, indent=1) + "\n").encode())
    finally:
        os.close(fd)
    os.replace(tmp, path)


async def _demo_user(settings: Settings, saved: DemoUser | None) -> tuple[DemoUser, bool]:
    from infra.stores.accounts import Accounts
    from infra.stores.session import AsyncSession, connect

    cluster, session = connect(settings)
    try:
        accounts = Accounts(AsyncSession(session))
        reusable = saved is not None and saved.keyspace == settings.keyspace
        if saved is not None and reusable and await accounts.user_for_token(saved.token) is not None:
            return saved, False
        user, token = await accounts.create_user("free", "demo")
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S%z")
        return DemoUser(user.user_id, "free", token, settings.keyspace, stamp), True
    finally:
        cluster.shutdown()


def ensure_demo_user(settings: Settings) -> tuple[DemoUser, bool]:
    """The demo user (free plan) from ``state_dir/demo-user.json``, created on first use, or again
    when its token no longer resolves (the keyspace was changed or wiped).  True when new."""
    path = demo_file(settings)
    user, new = asyncio.run(_demo_user(settings, load_demo_user(path)))
    if new:
        save_demo_user(path, user)
    return user, new


# ------------------------------------------------------------------------------------------- up_service


def up_service(
    settings: Settings,
    console: Console | None = None,
    *,
    workers: bool = True,
    timeout: float = START_TIMEOUT_S,
    worker_timeout: float | None = None,
    with_prometheus: bool = False,
) -> ServiceReport:
    """The whole service: the backbone (as :func:`up`), then a worker per pool (unless ``workers`` is
    False), the stages process and the gateway, all started at once; then the demo user."""
    wanted = app_specs(settings, workers=workers, with_prometheus=with_prometheus)
    missing = apps.missing_subcommands(wanted)
    if missing:
        raise StackError(
            f"`parley {'`, `parley '.join(missing)}` is not available: infra/local/cli.py does not register it",
            hint="start only Kafka, Cassandra and Redis with `parley up --backbone-only`",
        )
    if worker_timeout is not None:
        wanted = [
            dataclasses.replace(s, timeout=worker_timeout) if s.kind == "worker" else s for s in wanted
        ]
    backbone = up(settings, console, timeout)
    processes = start_apps(settings, wanted, console)
    demo, new = ensure_demo_user(settings)
    return ServiceReport(
        backbone, processes, demo, new, apps.gateway_url(settings, "/"), apps.gateway_url(settings, "/docs")
    )
