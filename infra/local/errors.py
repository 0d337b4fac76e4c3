"""The one exceptions module for infra: every failure says what happened and what to do next."""

from __future__ import annotations

from schemas.errors import ParleyError


class StackError(ParleyError, RuntimeError):
    """Something in the local stack could not be set up; ``str()`` is the whole actionable message."""

    def __init__(self, message: str, *, hint: str = "", log_tail: str = "") -> None:
        self.message, self.hint, self.log_tail = message, hint, log_tail
        parts = [message]
        if hint:
            parts.append(f"fix: {hint}")
        if log_tail:
            parts.append("last log lines:\n" + log_tail)
        super().__init__("\n".join(parts))


class JavaNotFound(StackError):
    """No Java 17 runtime to run Kafka and Cassandra with."""


class DownloadFailed(StackError):
    """Maven could not resolve the service jars (Maven missing, or Maven Central unreachable)."""


class PortInUse(StackError):
    """A configured port is held by a process that is not ours and does not answer as the service."""


class ServiceFailed(StackError):
    """A service exited, or did not become ready in time; carries the tail of its log."""


class InstallFailed(StackError):
    """A system package (redis-server) is missing and could not be installed."""
