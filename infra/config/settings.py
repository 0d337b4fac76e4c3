"""One typed settings object per process, built once from the environment.

Every ``PARLEY_*`` variable is named here and nowhere else (a unit test holds the rest of the code to it):
``VARS`` is the one table, read by ``from_env`` and written back by ``to_env`` for child processes. Every
default runs locally with no configuration at all. Handlers never read ``os.environ``; they receive a
``Settings`` (or the part of it they need).
"""
from __future__ import annotations

import ipaddress
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

PREFIX = "PARLEY_"
POOL_PREFIX = "POOL_"  # PARLEY_POOL_<NAME>_<FIELD>: one field of one engine pool
CONFIG_DIR = Path(__file__).resolve().parent


def env_var(name: str) -> str:
    """The full variable name for ``name`` (``GATEWAY_PORT`` -> ``PARLEY_GATEWAY_PORT``), for messages."""
    return f"{PREFIX}{name}"


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _bool(raw: str) -> bool:
    value = raw.strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"must be true or false, not {raw!r}")


def _names(raw: str) -> tuple[str, ...]:
    return tuple(n.strip() for n in raw.split(",") if n.strip())


def _path(raw: str) -> Path:
    return Path(raw).expanduser()


def _optional_int(raw: str) -> int | None:
    return int(raw) if raw.strip() else None


def _log_format(raw: str) -> str:
    value = raw.strip().lower()
    if value not in ("json", "text", "auto"):
        raise ValueError(f"must be json, text or auto, not {raw!r}")
    return value


def _broker_count(raw: str) -> int:
    value = int(raw)
    if value not in (1, 3):
        raise ValueError(f"must be 1 (one broker) or 3 (three KRaft brokers), not {raw!r}")
    return value


def _consistency(raw: str) -> str:
    value = raw.strip().upper()
    if value not in ("ONE", "LOCAL_ONE", "QUORUM", "LOCAL_QUORUM", "EACH_QUORUM", "ALL"):
        raise ValueError(f"must be a Cassandra consistency level such as LOCAL_QUORUM, not {raw!r}")
    return value


@dataclass(frozen=True)
class Ports:
    kafka: int = 9092
    kafka_controller: int = 9093
    cassandra: int = 9042
    cassandra_storage: int = 7000
    cassandra_jmx: int = 7199
    redis: int = 6379
    gateway: int = 8000  # the gateway's /metrics is on this port too
    stages_metrics: int = 9101  # the stages process's /metrics (every stage, labelled `stage`)
    prometheus: int = 9090  # `parley up --with-prometheus`


@dataclass(frozen=True)
class Settings:
    host: str = "127.0.0.1"
    ports: Ports = field(default_factory=Ports)
    cache_dir: Path = Path.home() / ".cache" / "parley"
    state_dir: Path = Path.home() / ".local" / "state" / "parley"
    keyspace: str = "parley"
    topic_prefix: str = ""
    kafka_heap_mb: int = 512  # per broker
    # 1: one broker that is its own controller; 3: three KRaft brokers on loopback (each a controller too),
    # topics replicated 3 times with min.insync.replicas 2, so one broker can die with nothing acknowledged lost
    kafka_brokers: int = 1
    cassandra_heap_mb: int = 1024
    default_pool: str = "large"
    prompt_budget_tokens: int = 6000
    max_message_chars: int = 32_000
    reader_timeout_s: float = 30.0  # a reply nobody reads for this long is cancelled
    admission_wait_s: float = 10.0  # the pipeline must queue or refuse a request this soon, or it is a 503
    kafka_send_timeout_s: float = 3.0  # a send Kafka has not acknowledged by then is a 503
    local_mode: bool = True  # the page may create demo users; default: on when the services are on loopback
    cursor_secret: str = ""  # signs page cursors; empty: a random key kept in the state folder
    session_ttl_s: int = 7 * 24 * 3600  # the page's sign-in lasts this long, then the cookie is refused
    token_ttl_days: int = 90  # an API token lasts this long unless its maker asks otherwise
    # Where browsers open the page (https://chat.example.com): its origin may spend the page's cookie and its
    # host is answered. Empty: only the loopback names at the gateway's port (never the request's own Host).
    public_url: str = ""
    allowed_hosts: tuple[str, ...] = ()  # more Host names answered (a service name, *.example.com); "*": any
    max_streams_per_user: int = 8  # replies and resumes one user may hold open on one gateway; then 429
    max_streams_per_gateway: int = 10_000  # those of all users on one gateway; then 503 (0: no limit)
    max_body_bytes: int = 4 * 1024 * 1024  # a request body over this is a 413 before it is read
    # Refused requests (4xx) one caller may make on one gateway: a bucket this deep, refilled at this rate;
    # while it is empty the caller gets 429 before its request is read. 0: no budget
    refusal_burst: int = 60
    refusals_per_minute: float = 120.0
    # A request from a caller whose bucket is empty is held this long at most (no CPU: a timer) before it is
    # heard (the bucket refilled meanwhile) or answered 429; a caller looping on refusals gets one answer per
    # connection per hold, not thousands a second. At most guard.HOLD_PER_CALLER held at once per caller
    refusal_hold_s: float = 1.0
    # Gateway i of N tails the partitions p of chat.tokens with p % N == i, and mints the generation ids of
    # the messages it accepts so their token records land there; another gateway's streams it follows through
    # a reader shared per partition while someone reads it
    gateway_index: int = 0
    gateway_count: int = 1
    # admission
    route_small_max_chars: int | None = None  # None: the short-message classifier is off
    min_visible_chars: int = 1
    history_allowance: int = 1_000  # tokens reserved for earlier turns before the prompt build trues it up
    # quota and reaper
    reservation_ttl_s: float = 300.0
    reaper_interval_s: float = 30.0
    # configuration files
    plans_file: Path = CONFIG_DIR / "plans.toml"
    pools_file: Path = CONFIG_DIR / "pools.toml"
    canned_file: Path = CONFIG_DIR / "canned.toml"
    safety_file: Path = CONFIG_DIR / "safety.toml"  # content rules; re-read when the file changes
    pool_overrides: tuple[tuple[str, str], ...] = ()  # ("LARGE_MAX_SEQS", "32"): PARLEY_POOL_<NAME>_<FIELD>
    debug: tuple[str, ...] = ()  # loggers run at DEBUG
    log_format: str = "auto"  # json | text | auto (text on a terminal, JSON lines otherwise)
    # operating: the seed's price of a GPU-hour, for the cost per 1,000 replies from the workers' busy time
    gpu_hour_usd: float = 2.50
    gpus_per_worker: int = 1
    # where the backbone is when it is not this machine's (a deployment): empty means host + the ports above
    kafka_servers: str = ""  # bootstrap servers, comma-separated
    redis_server: str = ""  # a redis:// URL
    cassandra_hosts: tuple[str, ...] = ()  # contact points
    cassandra_dc: str = "datacenter1"  # the local data centre (LOCAL_* consistency, keyspace replication)
    cassandra_replication: int = 1  # replicas per data centre of a keyspace the migrations create
    cassandra_consistency: str = "LOCAL_QUORUM"  # with one replica locally this is a single read or write
    # deletion and erasure
    key_cache_s: float = 10.0  # how long a process keeps a conversation's unwrapped data key
    purge_delay_s: float = 15.0  # the purge waits this long after a delete (longer than key_cache_s)
    retention_sweep_s: float = 3600.0  # how often conversations past their plan's retention_days are deleted
    token: str = ""  # the terminal chat client's bearer token

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Settings:
        environ = os.environ if environ is None else environ
        values: dict[str, Any] = {}
        ports: dict[str, Any] = {}
        for var in VARS:
            raw = environ.get(env_var(var.name))
            if raw is None or (raw == "" and var.parse is not str):
                continue
            try:
                parsed = var.parse(raw)
            except ValueError as exc:
                raise ValueError(f"{env_var(var.name)}: {exc}") from exc
            (ports if var.port else values)[var.field] = parsed
        full = env_var(POOL_PREFIX)
        values["pool_overrides"] = tuple(sorted((k[len(full):], v) for k, v in environ.items() if k.startswith(full)))
        values.setdefault("local_mode", is_loopback(cls.host))
        values["cassandra_heap_mb"] = min(values.get("cassandra_heap_mb", cls.cassandra_heap_mb), 1024)
        return cls(ports=Ports(**ports), **values)

    def to_env(self) -> dict[str, str]:
        """The variables that make ``from_env()`` in a child process equal this object, so a process started
        for a private stack (other ports, other state folder) talks to that stack."""
        env: dict[str, str] = {}
        for var in VARS:
            value = getattr(self.ports if var.port else self, var.field)
            if value is None or value == () or value == "":
                continue
            if isinstance(value, bool):
                env[env_var(var.name)] = "true" if value else "false"
            elif isinstance(value, tuple):
                env[env_var(var.name)] = ",".join(value)
            else:
                env[env_var(var.name)] = str(value)
        env.update({env_var(POOL_PREFIX + k): v for k, v in self.pool_overrides})
        return env

    def with_(self, **changes: Any) -> Settings:
        return replace(self, **changes)

    @property
    def kafka_bootstrap(self) -> str:
        return self.kafka_servers or ",".join(
            f"{self.host}:{self.kafka_node_ports(node)[0]}" for node in range(1, self.kafka_brokers + 1))

    def kafka_node_ports(self, node: int) -> tuple[int, int]:
        """Broker ``node``'s (client, controller) ports on this machine: node 1 has the configured ones,
        each next node the pair two above (9092/9093, 9094/9095, 9096/9097)."""
        step = 2 * (node - 1)
        return self.ports.kafka + step, self.ports.kafka_controller + step

    @property
    def kafka_replication(self) -> int:
        """Replicas of each topic the project creates (the internal ones included)."""
        return min(self.kafka_brokers, 3)

    @property
    def kafka_min_insync(self) -> int:
        """``min.insync.replicas``: with 3 replicas an acknowledged write (acks=all) is on 2 brokers at least."""
        return max(1, self.kafka_replication - 1)

    @property
    def redis_url(self) -> str:
        return self.redis_server or f"redis://{self.host}:{self.ports.redis}/0"

    @property
    def cassandra_contact_points(self) -> list[str]:
        return list(self.cassandra_hosts) or [self.host]


@dataclass(frozen=True)
class Var:
    name: str  # after PARLEY_
    field: str  # the Settings (or Ports) field
    parse: Callable[[str], Any]
    port: bool = False


def _port(name: str, field_name: str) -> Var:
    return Var(name, field_name, int, port=True)


VARS: tuple[Var, ...] = (
    _port("KAFKA_PORT", "kafka"),
    _port("KAFKA_CONTROLLER_PORT", "kafka_controller"),
    _port("CASSANDRA_PORT", "cassandra"),
    _port("CASSANDRA_STORAGE_PORT", "cassandra_storage"),
    _port("CASSANDRA_JMX_PORT", "cassandra_jmx"),
    _port("REDIS_PORT", "redis"),
    _port("GATEWAY_PORT", "gateway"),
    _port("STAGES_METRICS_PORT", "stages_metrics"),
    _port("PROMETHEUS_PORT", "prometheus"),
    Var("CACHE_DIR", "cache_dir", _path),
    Var("STATE_DIR", "state_dir", _path),
    Var("KEYSPACE", "keyspace", str),
    Var("TOPIC_PREFIX", "topic_prefix", str),
    Var("KAFKA_HEAP_MB", "kafka_heap_mb", int),
    Var("KAFKA_BROKERS", "kafka_brokers", _broker_count),
    Var("CASSANDRA_HEAP_MB", "cassandra_heap_mb", int),
    Var("DEFAULT_POOL", "default_pool", str),
    Var("PROMPT_BUDGET_TOKENS", "prompt_budget_tokens", int),
    Var("MAX_MESSAGE_CHARS", "max_message_chars", int),
    Var("READER_TIMEOUT_S", "reader_timeout_s", float),
    Var("ADMISSION_WAIT_S", "admission_wait_s", float),
    Var("KAFKA_SEND_TIMEOUT_S", "kafka_send_timeout_s", float),
    Var("CURSOR_SECRET", "cursor_secret", str),
    Var("LOCAL_MODE", "local_mode", _bool),
    Var("SESSION_TTL_S", "session_ttl_s", int),
    Var("TOKEN_TTL_DAYS", "token_ttl_days", int),
    Var("PUBLIC_URL", "public_url", str),
    Var("ALLOWED_HOSTS", "allowed_hosts", _names),
    Var("MAX_STREAMS_PER_USER", "max_streams_per_user", int),
    Var("MAX_STREAMS_PER_GATEWAY", "max_streams_per_gateway", int),
    Var("MAX_BODY_BYTES", "max_body_bytes", int),
    Var("REFUSAL_BURST", "refusal_burst", int),
    Var("REFUSALS_PER_MINUTE", "refusals_per_minute", float),
    Var("REFUSAL_HOLD_S", "refusal_hold_s", float),
    Var("GATEWAY_INDEX", "gateway_index", int),
    Var("GATEWAYS", "gateway_count", int),
    Var("ROUTE_SMALL_MAX_CHARS", "route_small_max_chars", _optional_int),
    Var("MIN_VISIBLE_CHARS", "min_visible_chars", int),
    Var("HISTORY_ALLOWANCE", "history_allowance", int),
    Var("RESERVATION_TTL_S", "reservation_ttl_s", float),
    Var("REAPER_INTERVAL_S", "reaper_interval_s", float),
    Var("PLANS_FILE", "plans_file", _path),
    Var("POOLS_FILE", "pools_file", _path),
    Var("CANNED_FILE", "canned_file", _path),
    Var("SAFETY_FILE", "safety_file", _path),
    Var("DEBUG", "debug", _names),
    Var("LOG_FORMAT", "log_format", _log_format),
    Var("GPU_HOUR_USD", "gpu_hour_usd", float),
    Var("GPUS_PER_WORKER", "gpus_per_worker", int),
    Var("KAFKA_SERVERS", "kafka_servers", str),
    Var("REDIS_SERVER", "redis_server", str),
    Var("CASSANDRA_HOSTS", "cassandra_hosts", _names),
    Var("CASSANDRA_DC", "cassandra_dc", str),
    Var("CASSANDRA_REPLICATION", "cassandra_replication", int),
    Var("CASSANDRA_CONSISTENCY", "cassandra_consistency", _consistency),
    Var("TOKEN", "token", str),
    Var("KEY_CACHE_S", "key_cache_s", float),
    Var("PURGE_DELAY_S", "purge_delay_s", float),
    Var("RETENTION_SWEEP_S", "retention_sweep_s", float),
)
