"""One typed settings object per process, built once from the environment.

Every default runs locally with no configuration at all. Handlers never read
``os.environ``; they receive a ``Settings`` (or the part of it they need).
"""
from __future__ import annotations

import ipaddress
import os
from dataclasses import dataclass, field, replace
from pathlib import Path


def _env(name: str, default: str) -> str:
    return os.environ.get(f"PARLEY_{name}", default)


def _env_int(name: str, default: int) -> int:
    return int(_env(name, str(default)))


def _env_bool(name: str, default: bool) -> bool:
    raw = _env(name, "").strip().lower()
    if not raw:
        return default
    if raw in ("1", "true", "yes", "on"):
        return True
    if raw in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"PARLEY_{name} must be true or false, not {raw!r}")


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


@dataclass(frozen=True)
class Ports:
    kafka: int = 9092
    kafka_controller: int = 9093
    cassandra: int = 9042
    cassandra_storage: int = 7000
    cassandra_jmx: int = 7199
    redis: int = 6379
    gateway: int = 8000


@dataclass(frozen=True)
class Settings:
    host: str = "127.0.0.1"
    ports: Ports = field(default_factory=Ports)
    cache_dir: Path = Path.home() / ".cache" / "parley"
    state_dir: Path = Path.home() / ".local" / "state" / "parley"
    keyspace: str = "parley"
    topic_prefix: str = ""
    kafka_heap_mb: int = 512
    cassandra_heap_mb: int = 1024
    default_pool: str = "large"
    prompt_budget_tokens: int = 6000
    max_message_chars: int = 32_000
    reader_timeout_s: float = 30.0  # a reply nobody reads for this long is cancelled
    admission_wait_s: float = 10.0  # the pipeline must queue or refuse a request this soon, or it is a 503
    kafka_send_timeout_s: float = 3.0  # a send Kafka has not acknowledged by then is a 503
    local_mode: bool = True  # the page may create demo users; default: on when the services are on loopback
    cursor_secret: str = ""  # signs page cursors; empty: a random key kept in the state folder

    @classmethod
    def from_env(cls) -> Settings:
        ports = Ports(
            kafka=_env_int("KAFKA_PORT", Ports.kafka),
            kafka_controller=_env_int("KAFKA_CONTROLLER_PORT", Ports.kafka_controller),
            cassandra=_env_int("CASSANDRA_PORT", Ports.cassandra),
            cassandra_storage=_env_int("CASSANDRA_STORAGE_PORT", Ports.cassandra_storage),
            cassandra_jmx=_env_int("CASSANDRA_JMX_PORT", Ports.cassandra_jmx),
            redis=_env_int("REDIS_PORT", Ports.redis),
            gateway=_env_int("GATEWAY_PORT", Ports.gateway),
        )
        return cls(
            ports=ports,
            cache_dir=Path(_env("CACHE_DIR", str(cls.cache_dir))).expanduser(),
            state_dir=Path(_env("STATE_DIR", str(cls.state_dir))).expanduser(),
            keyspace=_env("KEYSPACE", cls.keyspace),
            topic_prefix=_env("TOPIC_PREFIX", cls.topic_prefix),
            kafka_heap_mb=_env_int("KAFKA_HEAP_MB", cls.kafka_heap_mb),
            cassandra_heap_mb=min(_env_int("CASSANDRA_HEAP_MB", cls.cassandra_heap_mb), 1024),
            default_pool=_env("DEFAULT_POOL", cls.default_pool),
            prompt_budget_tokens=_env_int("PROMPT_BUDGET_TOKENS", cls.prompt_budget_tokens),
            max_message_chars=_env_int("MAX_MESSAGE_CHARS", cls.max_message_chars),
            reader_timeout_s=float(_env("READER_TIMEOUT_S", str(cls.reader_timeout_s))),
            admission_wait_s=float(_env("ADMISSION_WAIT_S", str(cls.admission_wait_s))),
            kafka_send_timeout_s=float(_env("KAFKA_SEND_TIMEOUT_S", str(cls.kafka_send_timeout_s))),
            local_mode=_env_bool("LOCAL_MODE", is_loopback(cls.host)),
            cursor_secret=_env("CURSOR_SECRET", cls.cursor_secret),
        )

    def with_(self, **changes: object) -> Settings:
        return replace(self, **changes)  # type: ignore[arg-type]

    @property
    def kafka_bootstrap(self) -> str:
        return f"{self.host}:{self.ports.kafka}"

    @property
    def redis_url(self) -> str:
        return f"redis://{self.host}:{self.ports.redis}/0"
