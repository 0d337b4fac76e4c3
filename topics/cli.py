"""``parley topics``: create missing topics, correct partitions and retention, print the catalogue."""
from __future__ import annotations

import argparse

from rich.console import Console
from rich.table import Table

from infra.config.settings import Settings
from topics.admin import ensure_topics
from topics.catalogue import Topics


def add_arguments(parser: argparse.ArgumentParser, name: str) -> None:
    parser.add_argument("--list", action="store_true", help="print the catalogue without touching the broker")


def run(args: argparse.Namespace) -> int:
    settings = Settings.from_env()
    actions = {} if args.list else ensure_topics(settings)
    table = Table("topic", "key", "events", "partitions", "retention", "producers", "groups", "action")
    for name, t in Topics(settings.topic_prefix).all():
        table.add_row(name, t.key, ", ".join(e.__name__ for e in t.events), str(t.partitions),
                      f"{t.retention_ms // 60000} min", ", ".join(t.producers), ", ".join(t.consumer_groups),
                      actions.get(name, "-"))
    Console().print(table)
    return 0
