"""A real load balancer (Debian's ``haproxy`` package) in front of the gateways for `parley up --gateways N`.

With N > 1 the gateways listen on the ports after the gateway port (8001, 8002, ...) and HAProxy takes the
gateway port itself (8000), so clients, the page and the load generator change nothing. The config is written
to ``<state>/balancer/haproxy.cfg``:

- ``leastconn``: a stream is a long connection, so the gateway with the fewest open ones takes the next;
- every gateway is checked on ``/healthz`` and one that stops answering is taken out within seconds;
- nothing is buffered or compressed on the way (HAProxy's defaults in HTTP mode; a stream's events pass as
  they come), and the client and server timeouts are longer than any keep-alive gap of an SSE stream.

Any gateway can take any request: the one that accepts a message mints its generation on its own partitions
of ``chat.tokens``; a resume that lands on another gateway follows that partition through a borrowed tail.
"""
from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from infra.config.settings import Settings
from infra.local.errors import StackError

STREAM_TIMEOUT = "1h"  # longer than any reply; the gateway sends a keep-alive every 10 s meanwhile


def gateway_ports(settings: Settings) -> list[int]:
    """Where each gateway listens: the gateway port with one gateway; the ports after it with several."""
    if settings.gateway_count <= 1:
        return [settings.ports.gateway]
    return [settings.ports.gateway + 1 + i for i in range(settings.gateway_count)]


def config(settings: Settings, ports: list[int] | None = None) -> str:
    """HAProxy's config: the gateway port in front of ``ports`` (default: the gateways `up` starts)."""
    servers = "\n".join(f"    server gw{i} {settings.host}:{port} check inter 2s fall 2 rise 1"
                        for i, port in enumerate(ports or gateway_ports(settings)))
    return f"""global
    maxconn 4096  # two descriptors each: under the usual 20,000-descriptor limit of a container

defaults
    mode http
    option dontlognull
    timeout connect 5s
    timeout client {STREAM_TIMEOUT}
    timeout server {STREAM_TIMEOUT}
    timeout http-request 30s
    timeout queue 30s

frontend parley
    bind {settings.host}:{settings.ports.gateway}
    default_backend gateways

backend gateways
    balance leastconn
    option httpchk GET /healthz
    http-check expect status 200
{servers}
"""


def home(settings: Settings) -> Path:
    return settings.state_dir / "balancer"


def write_config(settings: Settings) -> Path:
    folder = home(settings)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "haproxy.cfg"
    path.write_text(config(settings))
    return path


def find_binary() -> str | None:
    return shutil.which("haproxy") or next(
        (p for p in ("/usr/sbin/haproxy", "/usr/bin/haproxy") if os.path.exists(p)), None)


def install() -> str:
    """Debian's package, with apt-get, when running as root; its own service is not what we run."""
    found = find_binary()
    if found:
        return found
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        raise StackError("haproxy is not installed", hint="apt-get install -y --no-install-recommends haproxy")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    subprocess.run(["apt-get", "update", "-qq"], env=env, capture_output=True, timeout=600, check=False)
    done = subprocess.run(["apt-get", "install", "-y", "-qq", "--no-install-recommends", "haproxy"], env=env,
                          capture_output=True, text=True, timeout=900, check=False)
    found = find_binary()
    if found is None:
        raise StackError(f"apt-get install haproxy failed (exit {done.returncode})",
                         hint="apt-get install -y --no-install-recommends haproxy",
                         log_tail="\n".join((done.stdout + done.stderr).splitlines()[-10:]))
    return found


def command(binary: str, path: Path) -> tuple[str, ...]:
    return (binary, "-db", "-f", str(path))  # -db: in the foreground, so `down` stops it like the others
