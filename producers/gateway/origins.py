"""Which names this gateway answers to and which origins may spend the page's cookie, from settings only.

A request's own Host says nothing about where it came from: a page on ``evil.example`` whose DNS name is
re-pointed at 127.0.0.1 (DNS rebinding) sends ``Host: evil.example`` and ``Origin: http://evil.example``, which
agree. So the trusted hosts and allowed origins come from the settings (``public_url``, ``allowed_hosts``) and
the loopback names at the port the socket was bound to, never from the request. A request naming another Host
is a 400 before any route runs; the health and metrics endpoints answer any Host (probes and scrapers call
them by address).
"""
from __future__ import annotations

from urllib.parse import urlsplit

from starlette.datastructures import Headers
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from infra.config.settings import Settings, env_var

LOOPBACK_NAMES = ("localhost", "127.0.0.1", "[::1]")
OPEN_PATHS = frozenset({"/healthz", "/metrics"})
DEFAULT_PORTS = {"http": 80, "https": 443}


def trusted_hosts(settings: Settings) -> frozenset[str]:
    """Host names (no port) the gateway answers to; ``"*"`` among them means any. A deployment that names no
    public URL and is not in local mode answers any (it sits behind its own load balancer)."""
    named = {h.lower() for h in settings.allowed_hosts}
    public = urlsplit(settings.public_url).hostname if settings.public_url else None
    if public is None and not named and not settings.local_mode:
        return frozenset({"*"})
    return frozenset({*LOOPBACK_NAMES, *named, *([_bracketed(public)] if public else [])})


def allowed_origins(settings: Settings, port: int | None, host_header: str = "") -> frozenset[str]:
    """The public URL's origin, and the loopback names at the port this gateway listens on.

    In local mode, also the loopback address the request was sent to (its Host, when that is a loopback name):
    a page reached through a local proxy or load balancer on another port spends its cookie there. No other
    site can send that Host (a rebound name arrives as its own name, refused above), and a page on another
    loopback port sends its own origin, which then differs from the Host it calls.
    """
    origins = set()
    if settings.public_url:
        parts = urlsplit(settings.public_url)
        origins.add(_origin(parts.scheme, _bracketed(parts.hostname or ""), parts.port))
    for name in LOOPBACK_NAMES:
        origins.update(_origin(scheme, name, port) for scheme in ("http", "https"))
    host = host_header.strip().lower()
    if settings.local_mode and host and _host_only(host) in LOOPBACK_NAMES:
        origins.update(f"{scheme}://{host}" for scheme in ("http", "https"))
    return frozenset(origins)


def host_allowed(host_header: str, trusted: frozenset[str]) -> bool:
    if "*" in trusted:
        return True
    host = _host_only(host_header.strip().lower())
    return host in trusted or any(t.startswith("*.") and host.endswith(t[1:]) for t in trusted)


class TrustedHosts:
    """ASGI middleware: a request whose Host is not trusted is refused in the documented error shape."""

    def __init__(self, app: ASGIApp, settings: Settings) -> None:
        self.app, self.trusted = app, trusted_hosts(settings)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket") or scope.get("path") in OPEN_PATHS or \
                host_allowed(Headers(scope=scope).get("host", ""), self.trusted):
            await self.app(scope, receive, send)
            return
        response = JSONResponse({"error": {"code": "untrusted_host", "message": (
            f"This gateway does not answer to that host name. Use the address it is configured for "
            f"({env_var('PUBLIC_URL')}), or add the name to {env_var('ALLOWED_HOSTS')}.")}}, status_code=400)
        await response(scope, receive, send)


def _origin(scheme: str, host: str, port: int | None) -> str:
    return f"{scheme}://{host}" if port is None or DEFAULT_PORTS.get(scheme) == port else f"{scheme}://{host}:{port}"


def _bracketed(host: str) -> str:
    return f"[{host}]" if ":" in host and not host.startswith("[") else host.lower()


def _host_only(host: str) -> str:
    if host.startswith("["):
        return host[:host.find("]") + 1] if "]" in host else host
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host
