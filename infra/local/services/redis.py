"""Redis from Debian's ``redis-server`` package, run by us with our own config and data folder
(loopback only, append-only file on).  The Debian service, if the package started one, is never used."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import cast

from rich.console import Console

from infra.local.errors import InstallFailed
from infra.local.services import process
from infra.local.services.base import Probe, Service

SYSTEM_PID_FILE = Path("/run/redis/redis-server.pid")
SYSTEM_INIT_SCRIPT = Path("/etc/init.d/redis-server")


def redis_conf(*, host: str, port: int, data_dir: Path) -> str:
    return "\n".join(
        [
            "# written by `parley up`; edits are overwritten",
            f"bind {host}",
            "protected-mode yes",
            f"port {port}",
            "daemonize no",
            "supervised no",
            'logfile ""',
            f'dir "{data_dir}"',
            "dbfilename dump.rdb",
            "appendonly yes",
            "appendfsync everysec",
            "save 3600 1 300 100 60 10000",
            "always-show-logo no",
            "",
        ]
    )


def find_redis_server() -> Path | None:
    found = shutil.which("redis-server") or (
        "/usr/bin/redis-server" if os.path.exists("/usr/bin/redis-server") else None
    )
    return Path(found) if found else None


def _run(cmd: list[str], timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        cmd,
        check=False,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"},
    )


class Redis(Service):
    name = "redis"
    # Debian ships one binary: redis-server is a symlink to redis-check-rdb, which /proc/PID/exe shows.
    exe_names = ("redis-server", "redis-check-rdb", "redis-check-aof")

    @property
    def port(self) -> int:
        return self.settings.ports.redis

    @property
    def data_dir(self) -> Path:
        return self.home / "data"

    @property
    def cwd(self) -> Path:
        return self.data_dir  # redis chdir()s to its `dir`

    @property
    def config_file(self) -> Path:
        return self.home / "redis.conf"

    def install(self, console: Console | None = None) -> None:
        if find_redis_server() is not None:
            return
        if os.geteuid() != 0 or shutil.which("apt-get") is None:
            raise InstallFailed(
                "redis-server is not installed",
                hint="install Debian's package: apt-get install -y redis-server",
            )
        status = console.status("redis: apt-get install -y redis-server") if console else None
        if status:
            status.start()
        try:
            update = _run(["apt-get", "update"], timeout=600)
            install = _run(["apt-get", "install", "-y", "redis-server"], timeout=900)
        finally:
            if status:
                status.stop()
        if install.returncode != 0 or find_redis_server() is None:
            raise InstallFailed(
                f"apt-get install -y redis-server failed (exit {install.returncode})",
                hint="run it by hand to see why",
                log_tail="\n".join((update.stderr + install.stdout + install.stderr).splitlines()[-15:]),
            )
        if console:
            console.print("redis: installed Debian's redis-server")
        self.stop_system_redis(console)

    def stop_system_redis(self, console: Console | None = None) -> None:
        """The package's postinst may start Debian's own redis on 6379; we run our own instead."""
        pid = process.read_pid(SYSTEM_PID_FILE)
        if pid is None or not process.is_alive(pid):
            return
        exe = process.proc_exe(pid) or ""
        if Path(exe).name not in self.exe_names:
            return
        if Path("/run/systemd/system").is_dir() and shutil.which("systemctl"):
            _run(["systemctl", "stop", "redis-server"], timeout=60)
        elif SYSTEM_INIT_SCRIPT.exists():
            _run([str(SYSTEM_INIT_SCRIPT), "stop"], timeout=60)
        if process.is_alive(pid):
            process.stop(pid, timeout=15)
        if console:
            console.print(f"redis: stopped the redis-server the package started (pid {pid})")

    def prepare(self) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.config_file.write_text(
            redis_conf(host=self.settings.host, port=self.port, data_dir=self.data_dir)
        )

    def command(self) -> list[str]:
        server = find_redis_server()
        if server is None:
            raise InstallFailed("redis-server is not installed", hint="apt-get install -y redis-server")
        return [str(server), str(self.config_file)]

    def probe(self, timeout: float = 3.0) -> Probe:
        import redis

        client = redis.Redis(
            host=self.settings.host, port=self.port, socket_timeout=timeout, socket_connect_timeout=timeout
        )
        try:
            if not client.ping():
                return Probe(False, detail="PING failed")
            info = cast(dict[str, object], client.info("server"))  # the sync client answers a dict
            return Probe(True, version=str(info.get("redis_version")), detail="PING ok")
        except Exception as exc:  # noqa: BLE001 - any failure means "not ready"
            return Probe(False, detail=f"{type(exc).__name__}: {exc}"[:200])
        finally:
            client.close()
