"""Usage rollup (faust app ``usage-rollup``): ``UsageRecorded`` on ``usage`` ->
``usage_by_day`` in Cassandra, and a per-plan-per-minute table for analysts.

Settlement may publish one generation's record twice (a crash between Kafka's ack
and the outbox flag), so each (user, day) row remembers the generations it
counted and skips a repeat. Cassandra gets the row's absolute values after every
record, duplicates included: a crash between the table update and the write is
repaired by the redelivery, and a replay rewrites rather than adds.

The per-minute rollup is keyed by plan, so records are first re-keyed through an
app-internal topic: every (plan, minute) row then lives on one partition and one
worker, whichever users' partitions fed it.
"""
from __future__ import annotations

import logging
import time
from datetime import UTC, datetime
from typing import Any

import faust

from infra.config.settings import Settings
from infra.stores.records import Records, UsageDay
from schemas import UsageRecorded
from streams.app import applied, make_app, topic
from streams.codec import CODEC_NAME
from topics import Role, Topics
from topics.catalogue import DEADLETTER, USAGE, USAGE_ROLLUP

log = logging.getLogger(__name__)
ROLE = Role(USAGE_ROLLUP, reads=(USAGE,), writes=(DEADLETTER,))
COUNTED = ("tokens_in", "tokens_out", "tokens_cached", "charged_tokens")
DAYS_TABLE, MINUTES_TABLE = "usage_day", "plan_minute"


def add_to_day(row: dict[str, Any] | None, record: UsageRecorded) -> dict[str, Any] | None:
    """The (user, day) row with ``record`` counted, or None if it was counted already."""
    row = row or {"replies": 0, "generations": [], **{name: 0 for name in COUNTED}}
    if record.generation_id in row["generations"]:
        return None
    added = {name: row[name] + getattr(record, name) for name in COUNTED}
    return {**row, **added, "replies": row["replies"] + 1, "generations": [*row["generations"], record.generation_id]}


def add_to_minute(row: dict[str, int] | None, record: UsageRecorded) -> dict[str, int]:
    row = row or {"replies": 0, "failed": 0, **{name: 0 for name in COUNTED}}
    added = {name: row[name] + getattr(record, name) for name in COUNTED}
    return {**row, **added, "replies": row["replies"] + 1, "failed": row["failed"] + (record.status == "failed")}


def minute_of(record: UsageRecorded) -> str:
    stamp = record.finished_at or record.at
    return datetime.fromtimestamp(stamp, UTC).strftime("%Y-%m-%dT%H:%M")


def usage_day(user_id: str, day: str, row: dict[str, Any]) -> UsageDay:
    return UsageDay(user_id=user_id, day=day, tokens_in=row["tokens_in"], tokens_out=row["tokens_out"],
                    tokens_cached=row["tokens_cached"], replies=row["replies"])


def plan_minutes(app: faust.App, plan: str) -> dict[str, dict[str, int]]:
    """The analysts' query: minute (UTC, ``YYYY-MM-DDTHH:MM``) -> totals for one plan, on this worker."""
    table: Any = app.tables[MINUTES_TABLE]  # a faust Table: a mapping
    return {key.split("|", 1)[1]: dict(row) for key, row in sorted(table.items()) if key.startswith(f"{plan}|")}


def build_app(settings: Settings, records: Records, *, log_every_s: float = 60.0) -> faust.App:
    app = make_app(ROLE.stage, settings)
    topics = Topics(settings.topic_prefix)
    partitions = USAGE.partitions  # tables are co-partitioned with their source topic
    days = app.Table(DAYS_TABLE, default=None, partitions=partitions)
    minutes = app.Table(MINUTES_TABLE, default=None, partitions=partitions)
    by_plan = app.topic(topics.internal(ROLE.stage, "by-plan"), internal=True, partitions=partitions,
                        value_serializer=CODEC_NAME, key_serializer="raw")

    @app.agent(topic(app, topics, USAGE))
    async def roll_days(stream: faust.StreamT) -> None:
        async for record in stream:
            if not isinstance(record, UsageRecorded):
                continue
            key = f"{record.user_id}|{record.day}"
            row = add_to_day(days.get(key), record)
            if row is None:
                log.info("generation %s usage already counted for user %s day %s; duplicate skipped",
                         record.generation_id, record.user_id, record.day)
            else:
                days[key] = row
                await by_plan.send(key=record.plan.encode(), value=record)
            # Written (a Cassandra outage waited out here) before faust may acknowledge the record.
            await applied(ROLE.stage, stream, topics, records.put_usage_day,
                          usage_day(record.user_id, record.day, days[key]))

    @app.agent(by_plan)
    async def roll_minutes(stream: faust.StreamT) -> None:
        async for record in stream:
            key = f"{record.plan}|{minute_of(record)}"
            minutes[key] = add_to_minute(minutes.get(key), record)

    @app.timer(log_every_s)
    async def log_last_minute() -> None:
        minute = datetime.fromtimestamp(time.time() - 60, UTC).strftime("%Y-%m-%dT%H:%M")
        for key, row in list(minutes.items()):
            plan, at = key.split("|", 1)
            if at == minute:
                log.info("usage %s plan %s: %d replies (%d failed), in %d, out %d, cached %d tokens", minute, plan,
                         row["replies"], row["failed"], row["tokens_in"], row["tokens_out"], row["tokens_cached"])

    return app
