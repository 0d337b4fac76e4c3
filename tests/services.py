"""Where the test suite's Kafka, Cassandra and Redis come from.

Default (``PARLEY_TEST_SERVICES=local``): the project's own infra code starts
them from Maven Central jars and Debian's redis-server, reusing a running stack.
``PARLEY_TEST_SERVICES=testcontainers`` starts containers instead; that needs a
reachable Docker engine, which these build machines do not have.
"""
from __future__ import annotations

import os
from contextlib import ExitStack

from infra.config.settings import Ports, Settings


def provide(stack: ExitStack) -> Settings:
    mode = os.environ.get("PARLEY_TEST_SERVICES", "local")
    if mode == "local":
        from infra.local import stack as local_stack

        settings = Settings.from_env()
        local_stack.up(settings)
        return settings
    if mode == "testcontainers":
        return _containers(stack)
    raise ValueError(f"PARLEY_TEST_SERVICES must be 'local' or 'testcontainers', not {mode!r}")


def _containers(stack: ExitStack) -> Settings:  # pragma: no cover - needs a Docker engine
    from testcontainers.cassandra import CassandraContainer
    from testcontainers.kafka import KafkaContainer
    from testcontainers.redis import RedisContainer

    kafka = stack.enter_context(KafkaContainer("apache/kafka:4.1.0").with_kraft())
    cassandra = stack.enter_context(CassandraContainer("cassandra:5.0"))
    redis = stack.enter_context(RedisContainer("redis:7"))
    ports = Ports(
        kafka=int(kafka.get_bootstrap_server().rsplit(":", 1)[1]),
        cassandra=int(cassandra.get_exposed_port(9042)),
        redis=int(redis.get_exposed_port(6379)),
    )
    return Settings.from_env().with_(ports=ports)
