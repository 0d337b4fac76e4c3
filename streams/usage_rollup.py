"""Usage rollup (faust app ``usage-rollup``): ``UsageRecorded`` on ``usage`` -> each user's day in
Cassandra, and a per-plan-per-minute table for analysts.
Settlement may publish one generation's record twice (a crash between Kafka's ack
and the outbox flag), and a crashed rollup is handed records again. So the day's
totals live in Cassandra, not in this process: each record writes its generation's
row in the ``usage_by_generation`` ledger and the day's new totals in one conditional
batch on the ledger's partition (``Records.count_usage``: O(1) statements, a second
write of it does not apply). Those totals are the day's figures (``Records.usage_day``; ``usage_by_day``
is read only for days counted before the totals existed). Nothing
the rollup held in memory decides a total: an in-memory faust table, restored from
its changelog after a SIGKILL while records were already being handled, once lost a
reply from a day's row for good.
The per-minute rollup is keyed by plan, so records are first re-keyed through an
app-internal topic: every (plan, minute) row then lives on one partition and one
worker, whichever users' partitions fed it. A record is re-keyed once, when the
ledger first counts it.

A reconciler (``Reconciler``, every 30 s) reads this instance's ``usage`` partitions again over the time
since its last pass and counts any record the ledger lacks. faust's table recovery once committed records
the agent was never handed (the fault suite's stages SIGKILL: a day row held 1 reply of 2); ``streams.faust_patches``
now fixes that order and refuses to commit past a hole, and the reconciler stays as the day count's second
line. The agent and the reconciler count one record at a time (a lock), so neither rewrites a day row from
an older sum than the other's.
"""
from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any

import faust
from aiokafka.errors import KafkaError

from infra.config.settings import Settings
from infra.stores.records import Records
from infra.stores.retry import until_stored
from schemas import EventDecodeError, UsageRecorded, decode
from streams.app import applied, make_app, topic
from streams.codec import CODEC_NAME
from topics import Role, Topics
from topics.catalogue import DEADLETTER, USAGE, USAGE_ROLLUP
from topics.replay import open_reader, read_to_end

log = logging.getLogger(__name__)
ROLE = Role(USAGE_ROLLUP, reads=(USAGE,), writes=(DEADLETTER,))
COUNTED = ("tokens_in", "tokens_out", "tokens_cached", "charged_tokens")
MINUTES_TABLE = "plan_minute"
RECONCILE_EVERY_S = 30.0
RECONCILE_OVERLAP_S = 60.0  # each pass starts this long before the previous one began
FIRST_LOOKBACK_S = 900.0  # the first pass after a start covers the restart that preceded it


class Recent:
    """Generation ids this process saw in the ledger (the last ``keep``): the reconciler re-reads a window of
    the topic every pass, and asking Cassandra again about each record the agent counted made its cost grow
    with the requests in the window."""

    def __init__(self, keep: int = 100_000) -> None:
        self.keep, self.ids = keep, OrderedDict[str, None]()

    def add(self, generation_id: str) -> None:
        self.ids[generation_id] = None
        if len(self.ids) > self.keep:
            self.ids.popitem(last=False)

    def __contains__(self, generation_id: object) -> bool:
        return generation_id in self.ids


class Reconciler:
    """Counts the ``usage`` records of some partitions that the ledger lacks, from a time on."""

    def __init__(self, settings: Settings, records: Records, count: Callable[[UsageRecorded], Awaitable[bool]],
                 seen: Recent | None = None) -> None:
        self.settings, self.records, self.count = settings, records, count
        self.topic = Topics(settings.topic_prefix).usage
        self.began: float | None = None
        self.seen = seen if seen is not None else Recent()

    def since(self, now: float) -> float:
        return now - FIRST_LOOKBACK_S if self.began is None else self.began - RECONCILE_OVERLAP_S

    async def run(self, partitions: set[int], now: float | None = None) -> int:
        """One pass over ``partitions``; how many records it counted that the ledger lacked."""
        now = time.time() if now is None else now
        since, counted = self.since(now), 0
        reader = await open_reader(self.settings.kafka_bootstrap, self.topic, since_ms=int(since * 1000))
        try:
            for tp in reader.partitions:
                if tp.partition not in partitions:
                    continue
                async for rec in read_to_end(reader, tp):
                    try:
                        record = decode(rec.value, (UsageRecorded,))
                    except EventDecodeError:
                        continue  # the agent dead-letters it
                    if not isinstance(record, UsageRecorded) or record.generation_id in self.seen:
                        continue
                    if await until_stored(ROLE.stage, self.records.usage_counted, record.user_id, record.day,
                                          record.generation_id):
                        self.seen.add(record.generation_id)
                        continue
                    if await self.count(record):
                        counted += 1
                        # Either the agent was never handed it, or it is still on its way to the agent (held
                        # up by a store stall, say): the agent then finds it counted and rewrites the same day.
                        log.warning("generation %s usage for user %s day %s was not in the ledger %.0f s after it "
                                    "was published (partition %d offset %d); counted by the reconciler",
                                    record.generation_id, record.user_id, record.day,
                                    now - rec.timestamp / 1000, tp.partition, rec.offset)
        finally:
            await reader.close()
        self.began = now
        return counted

    async def run_assigned(self, consumer: Any) -> None:
        """One pass over the partitions of the topic ``consumer`` is assigned; an outage skips the pass (the
        next one reads its window too)."""
        try:
            mine = {tp.partition for tp in consumer.assignment() if tp.topic == self.topic}
            if mine:
                await self.run(mine)
        except KafkaError as exc:  # an outage: the next pass covers this one's window too
            log.warning("usage reconciliation skipped: Kafka unreachable (%s); the next pass reads its window "
                        "again", type(exc).__name__)
        except Exception:  # noqa: BLE001 - as above
            log.exception("usage reconciliation failed; the next pass reads its window again")


def add_to_minute(row: dict[str, int] | None, record: UsageRecorded) -> dict[str, int]:
    row = row or {"replies": 0, "failed": 0, **{name: 0 for name in COUNTED}}
    added = {name: row[name] + getattr(record, name) for name in COUNTED}
    return {**row, **added, "replies": row["replies"] + 1, "failed": row["failed"] + (record.status == "failed")}


def minute_of(record: UsageRecorded) -> str:
    stamp = record.finished_at or record.at
    return datetime.fromtimestamp(stamp, UTC).strftime("%Y-%m-%dT%H:%M")


def log_minute(minutes: Any, minute: str) -> None:
    """Each plan's totals for ``minute`` (``YYYY-MM-DDTHH:MM``), one log line per plan."""
    for key, row in list(minutes.items()):
        plan, at = key.split("|", 1)
        if at == minute:
            log.info("usage %s plan %s: %d replies (%d failed), in %d, out %d, cached %d tokens", minute, plan,
                     row["replies"], row["failed"], row["tokens_in"], row["tokens_out"], row["tokens_cached"])


def plan_minutes(app: faust.App, plan: str) -> dict[str, dict[str, int]]:
    """The analysts' query: minute (UTC, ``YYYY-MM-DDTHH:MM``) -> totals for one plan, on this worker."""
    table: Any = app.tables[MINUTES_TABLE]  # a faust Table: a mapping
    return {key.split("|", 1)[1]: dict(row) for key, row in sorted(table.items()) if key.startswith(f"{plan}|")}


class DayCounts:
    """The day totals' writes. The agent and the reconciler count one record at a time (a lock), so neither
    rewrites a day row from an older sum than the other's; a record new to the ledger is then re-keyed by plan
    for the minutes."""

    def __init__(self, records: Records, topics: Topics, by_plan: Any) -> None:
        self.records, self.topics, self.by_plan = records, topics, by_plan
        self.one_at_a_time = asyncio.Lock()
        self.seen = Recent()

    async def count(self, stream: faust.StreamT, record: UsageRecorded) -> None:
        """A record the agent was handed: written (a Cassandra outage waited out here) before faust may
        acknowledge it."""
        async with self.one_at_a_time:
            counted = await applied(ROLE.stage, stream, self.topics, self.records.count_usage, record.user_id,
                                    record.day, record.generation_id, record.tokens_in, record.tokens_out,
                                    record.tokens_cached)
        if counted is None:
            return  # dead-lettered
        if not await self.rekeyed(record, counted[1]):
            log.info("generation %s usage already counted for user %s day %s; day rewritten from the ledger",
                     record.generation_id, record.user_id, record.day)

    async def count_missed(self, record: UsageRecorded) -> bool:
        """A record the reconciler found missing from the ledger."""
        async with self.one_at_a_time:
            _, new = await until_stored(ROLE.stage, self.records.count_usage, record.user_id, record.day,
                                        record.generation_id, record.tokens_in, record.tokens_out,
                                        record.tokens_cached)
        return await self.rekeyed(record, new)

    async def rekeyed(self, record: UsageRecorded, new: bool) -> bool:
        """After the ledger counted ``record``: re-keyed by plan for the minutes, if it was new there."""
        self.seen.add(record.generation_id)
        if new:
            await self.by_plan.send(key=record.plan.encode(), value=record)
        return new


def build_app(settings: Settings, records: Records, *, log_every_s: float = 60.0) -> faust.App:
    app = make_app(ROLE.stage, settings)
    topics = Topics(settings.topic_prefix)
    partitions = USAGE.partitions  # tables are co-partitioned with their source topic
    minutes = app.Table(MINUTES_TABLE, default=None, partitions=partitions)
    by_plan = app.topic(topics.internal(ROLE.stage, "by-plan"), internal=True, partitions=partitions,
                        value_serializer=CODEC_NAME, key_serializer="raw")

    days = DayCounts(records, topics, by_plan)

    @app.agent(topic(app, topics, USAGE))
    async def roll_days(stream: faust.StreamT) -> None:
        async for record in stream:
            if isinstance(record, UsageRecorded):
                await days.count(stream, record)

    reconciler = Reconciler(settings, records, days.count_missed, days.seen)

    @app.timer(RECONCILE_EVERY_S)
    async def reconcile() -> None:
        await reconciler.run_assigned(app.consumer)

    @app.agent(by_plan)
    async def roll_minutes(stream: faust.StreamT) -> None:
        async for record in stream:
            key = f"{record.plan}|{minute_of(record)}"
            minutes[key] = add_to_minute(minutes.get(key), record)

    @app.timer(log_every_s)
    async def log_last_minute() -> None:
        log_minute(minutes, datetime.fromtimestamp(time.time() - 60, UTC).strftime("%Y-%m-%dT%H:%M"))

    return app
