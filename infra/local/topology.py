"""The deployment's topics: the catalogue with the configured prefix and pools, and ``parley topics``
(create missing topics, correct partitions and retention, print the catalogue)."""
from __future__ import annotations

import argparse
import asyncio
import logging

from infra.config.pools import load_pools
from infra.config.settings import Settings
from topics import Topics
from topics.admin import ensure_topics_async

log = logging.getLogger(__name__)


def deployment_topics(settings: Settings) -> Topics:
    """Every topic name this deployment uses, ``generate.<pool>.<lane>`` for each pool in the pools file."""
    return Topics(settings.topic_prefix, load_pools(settings))


def ensure_topics(settings: Settings) -> dict[str, str]:
    topics = deployment_topics(settings)
    actions = asyncio.run(ensure_topics_async(settings.kafka_bootstrap, topics.prefix, topics.pools,
                                                   settings.kafka_replication, settings.kafka_min_insync))
    changed = {n: a for n, a in actions.items() if a != "ok"}
    log.info("topics: %d in catalogue, changed %s", len(actions), changed or "none")
    return actions


def add_arguments(parser: argparse.ArgumentParser, name: str) -> None:
    parser.add_argument("--list", action="store_true", help="print the catalogue without touching the broker")


def run(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    settings = Settings.from_env()
    actions = {} if args.list else ensure_topics(settings)
    table = Table("topic", "key", "events", "partitions", "retention", "producers", "readers", "action")
    topics = deployment_topics(settings)
    for name, t in topics.all() + topics.internals():
        table.add_row(name, t.key, ", ".join(e.__name__ for e in t.events), str(t.partitions),
                      f"{t.retention_ms // 60000} min", ", ".join(t.producers), ", ".join(t.readers),
                      actions.get(name, "-"))
    Console().print(table)
    return 0
