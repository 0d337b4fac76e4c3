"""What the stages process measures besides its stages: the Kafka consumer lag of every consumer group in
the catalogue (workers' included, so one scrape shows every queue's depth) and the reservations outstanding
in Redis. Polled every few seconds, served with the stages' own metrics on the stages process's port.
"""
from __future__ import annotations

import asyncio
import logging
from typing import Any

from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.errors import KafkaError
from prometheus_client import Gauge, start_http_server
from redis.exceptions import RedisError

from infra.config.pools import load_pools
from infra.config.settings import Settings
from infra.stores import keys
from topics.clients import make_consumer
from topics.metrics import catalogue_groups, measure_lag

log = logging.getLogger(__name__)
POLL_S = 5.0
RESERVATIONS = Gauge("parley_reservations_outstanding", "token reservations made and not yet settled")


def serve(port: int, host: str = "127.0.0.1") -> int:
    """The process-wide registry (every stage's metrics and these) on ``port``; 0 picks a free one."""
    server, _thread = start_http_server(port, addr=host)
    return int(server.server_port)


async def poll(settings: Settings, redis: Any, every_s: float = POLL_S) -> None:
    """Forever: consumer lag per group and topic, reservations outstanding. A store that is down only
    leaves the last values standing (and a warning); the stages keep running."""
    admin = AIOKafkaAdminClient(bootstrap_servers=settings.kafka_bootstrap)
    reader = make_consumer(settings.kafka_bootstrap, group_id=None)
    await admin.start()
    await reader.start()
    groups = catalogue_groups(settings.topic_prefix, load_pools(settings))
    coordinators: dict[str, int] = {}
    try:
        while True:
            try:
                await measure_lag(admin, reader, groups, coordinators)
                RESERVATIONS.set(await redis.zcard(keys.reservations_by_expiry(settings.topic_prefix)))
            except (KafkaError, RedisError, OSError, RuntimeError) as exc:
                log.warning("telemetry poll failed: %s", type(exc).__name__)
            await asyncio.sleep(every_s)
    finally:
        await reader.stop()
        await admin.close()
