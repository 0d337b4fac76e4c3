"""``parley billing replay --since ISO [--until ISO]`` (until: now): audit usage against the stores.

Reads the ``usage`` topic again, recomputes per (user, day) totals (each
generation once), and compares them with the day's figures in Cassandra (the usage ledger's totals, written by
the usage rollup) and Redis's day counters (charged by settlement), and checks every
charge against the replies log (``chat.replies``): a charge with no finished reply
behind it, or one that differs from what that reply used, is a mismatch too. Prints
every mismatch and exits 1 if there is any.

Days are compared whole: the replay starts at 00:00 UTC of ``--since``'s day and
reads to the end of the topic, because a day's record can be published after the
day ends (a reply that straddles midnight, a reaped reservation). Only (user, day)
pairs with a record in the topic are checked; Redis counters older than their
lifetime are reported as not compared rather than as mismatches. ``--user`` (repeatable)
audits only those users.
"""
from __future__ import annotations

import argparse
import asyncio
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from typing import Any

from infra.config.settings import Settings
from infra.stores import keys
from infra.stores.records import Records
from infra.stores.settling import charge_for
from schemas import GenerationFinished, UsageRecorded
from topics import Role, Topics
from topics.catalogue import BILLING, REPLIES, USAGE
from topics.replay import replay as replay_topic

ROLE = Role(BILLING, reads=(USAGE, REPLIES), writes=())  # replays usage and replies without a group
REDIS_DAYS = 8  # the quota's day-counter lifetime (Quota.day_ttl_s)


@dataclass
class DayTotals:
    tokens_in: int = 0
    tokens_out: int = 0
    tokens_cached: int = 0
    replies: int = 0
    charged: int = 0
    generations: set[str] = field(default_factory=set)

    def add(self, r: UsageRecorded) -> None:
        if r.generation_id in self.generations:
            return  # settlement may publish a record twice; billing counts it once
        self.generations.add(r.generation_id)
        self.tokens_in += r.tokens_in
        self.tokens_out += r.tokens_out
        self.tokens_cached += r.tokens_cached
        self.replies += 1
        self.charged += r.charged_tokens


@dataclass(frozen=True)
class Mismatch:
    user_id: str
    day: str
    store: str  # "cassandra", "redis", or "replies" (a charge the replies log does not account for)
    field: str
    expected: int | None  # recomputed from the topic (for "replies": what the reply used, 0 with no reply)
    found: int | None  # None: no row/counter at all (for "replies": the charge recorded)
    generation_id: str = ""


def parse_when(text: str) -> datetime:
    when = datetime.fromisoformat(text)  # 3.11 reads a trailing Z
    return when if when.tzinfo else when.replace(tzinfo=UTC)


async def recompute(settings: Settings, since: datetime, until: datetime,
                    charges: dict[str, UsageRecorded] | None = None) -> dict[tuple[str, str], DayTotals]:
    """Per (user, day) totals; ``charges`` (if given) collects each generation's record."""
    first, last = since.astimezone(UTC).date(), until.astimezone(UTC).date()
    totals: dict[tuple[str, str], DayTotals] = {}
    async for record in replay_topic(settings.kafka_bootstrap, Topics(settings.topic_prefix).usage,
                                     _day_start(first), (UsageRecorded,)):
        if isinstance(record, UsageRecorded) and first <= date.fromisoformat(record.day) <= last:
            totals.setdefault((record.user_id, record.day), DayTotals()).add(record)
            if charges is not None:
                charges[record.generation_id] = record
    return totals


def _day_start(day: date) -> float:
    return datetime.combine(day, datetime.min.time(), UTC).timestamp()


async def finished_replies(settings: Settings, since: datetime) -> dict[str, GenerationFinished]:
    """Every reply's GenerationFinished on the replies log from ``since``'s day on (titles and summaries
    are the service's own calls and never charged)."""
    found: dict[str, GenerationFinished] = {}
    async for event in replay_topic(settings.kafka_bootstrap, Topics(settings.topic_prefix).replies,
                                    _day_start(since.astimezone(UTC).date()) - 3600, (GenerationFinished,)):
        if isinstance(event, GenerationFinished) and event.purpose == "reply":
            found[event.generation_id] = event
    return found


def unmatched_charges(charges: dict[str, UsageRecorded],
                      replies: dict[str, GenerationFinished]) -> list[Mismatch]:
    """Pure: every charge the replies log does not account for (no reply at all, or another amount)."""
    out = []
    for gid, record in sorted(charges.items()):
        reply = replies.get(gid)
        expected = sum(charge_for(reply)) if reply is not None else 0
        if record.charged_tokens != expected:
            out.append(Mismatch(record.user_id, record.day, "replies", "charged" if reply else "charged, no reply",
                                expected, record.charged_tokens, gid))
    return out


def compare_row(user_id: str, day: str, want: DayTotals, row: Any | None, used: int | None,
                redis_checked: bool) -> list[Mismatch]:
    """Pure: the differences between the recomputed totals and what the stores hold."""
    out = []
    for name in ("tokens_in", "tokens_out", "tokens_cached", "replies"):
        found = None if row is None else getattr(row, name)
        if found != getattr(want, name):
            out.append(Mismatch(user_id, day, "cassandra", name, getattr(want, name), found))
    if redis_checked and used != want.charged:
        out.append(Mismatch(user_id, day, "redis", "used", want.charged, used))
    return out


async def replay(settings: Settings, since: datetime, until: datetime, *, redis: Any,
                 records: Records, today: date | None = None,
                 users: set[str] | None = None) -> tuple[list[Mismatch], int]:
    """(mismatches, number of (user, day) pairs checked); ``users``: audit only these."""
    today = today or datetime.now(UTC).date()
    charges: dict[str, UsageRecorded] = {}
    totals = await recompute(settings, since, until, charges)
    if users is not None:
        totals = {k: v for k, v in totals.items() if k[0] in users}
        charges = {g: r for g, r in charges.items() if r.user_id in users}
    mismatches: list[Mismatch] = unmatched_charges(charges, await finished_replies(settings, since))
    for (user_id, day), want in sorted(totals.items()):
        row = await records.usage_day(user_id, day)
        used = await redis.hget(keys.quota_day(user_id, day), "used")
        fresh = date.fromisoformat(day) > today - timedelta(days=REDIS_DAYS)
        mismatches += compare_row(user_id, day, want, row, None if used is None else int(used),
                                  redis_checked=fresh or used is not None)
    return mismatches, len(totals)


def print_report(mismatches: list[Mismatch], checked: int) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    if not mismatches:
        console.print(f"[green]billing replay: {checked} user-days checked, no mismatches[/green]")
        return
    table = Table(title=f"billing replay: {len(mismatches)} mismatches in {checked} user-days")
    for column in ("user", "day", "store", "field", "generation", "expected", "found"):
        table.add_column(column)
    for m in mismatches:
        table.add_row(m.user_id, m.day, m.store, m.field, m.generation_id or "-", str(m.expected),
                      "missing" if m.found is None else str(m.found))
    console.print(table)


def add_arguments(parser: argparse.ArgumentParser, name: str) -> None:
    actions = parser.add_subparsers(dest="action", required=True)
    cmd = actions.add_parser("replay", help="recompute usage from the topic and compare with the stores")
    cmd.add_argument("--since", required=True, type=parse_when, help="ISO time (UTC if no zone)")
    cmd.add_argument("--until", type=parse_when, default=None, help="ISO time (UTC if no zone); default: now")
    cmd.add_argument("--user", action="append", dest="users", default=None, metavar="USER_ID",
                     help="audit only this user (repeatable); default: every user with usage in the window")


async def _run(settings: Settings, since: datetime, until: datetime,
               users: set[str] | None = None) -> tuple[list[Mismatch], int]:
    import redis.asyncio as aioredis

    from infra.stores.session import AsyncSession, connect

    cluster, session = connect(settings)
    client = aioredis.Redis.from_url(settings.redis_url)
    try:
        return await replay(settings, since, until, redis=client, records=Records(AsyncSession(session)),
                            users=users)
    finally:
        await client.aclose()
        cluster.shutdown()


def run(args: argparse.Namespace) -> int:
    until = args.until or datetime.now(UTC)
    users = set(args.users) if getattr(args, "users", None) else None
    mismatches, checked = asyncio.run(_run(Settings.from_env(), args.since, until, users))
    print_report(mismatches, checked)
    return 1 if mismatches else 0
