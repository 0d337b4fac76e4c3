"""Generations, daily usage and conversation summaries."""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from infra.stores.sealing import Sealer
from infra.stores.session import AsyncSession


@dataclass(frozen=True)
class UsageDay:
    user_id: str
    day: str
    tokens_in: int
    tokens_out: int
    tokens_cached: int
    replies: int


@dataclass(frozen=True)
class Summary:
    conversation_id: str
    upto_turn: int
    summary: str
    tokens: int


def _ts(epoch: float | None) -> datetime | None:
    return datetime.fromtimestamp(epoch, UTC) if epoch else None


DAYS_KNOWN = 10_000  # (user, day) totals remembered by the process that counts them
# The first day every counter wrote the totals with the ledger's rows: a partition of this day or later has them
# from its first row on, so a day this process has not counted is tried as new (no read), and the batch's answer
# says otherwise. Older days may hold ledger rows without totals, which only a read finds.
TOTALS_SINCE = "2026-12-03"
Totals = tuple[tuple[int, int, int, int], int | None]  # ((in, out, cached, replies), the replies expected)


class Records:
    def __init__(self, db: AsyncSession, sealer: Sealer | None = None) -> None:
        self.db, self.sealer = db, sealer  # with a sealer, summaries are stored sealed
        # The totals this process last wrote per (user, day): the next count's compare-and-set starts from them
        # instead of reading them back. The batch's condition still decides; a stale entry costs one retry.
        self._days: OrderedDict[tuple[str, str], Totals] = OrderedDict()

    async def save_generation(self, *, generation_id: str, conversation_id: str, user_id: str, message_id: str,
                              user_message_id: str, turn: int, status: str, model_pool: str, model: str = "",
                              replica: str = "", queued_at: float | None = None,
                              first_token_at: float | None = None, finished_at: float | None = None) -> None:
        await self.db.execute(
            "INSERT INTO generations (generation_id, conversation_id, user_id, message_id, user_message_id, turn, "
            "status, model_pool, model, replica, queued_at, first_token_at, finished_at) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (generation_id, conversation_id, user_id, message_id, user_message_id, turn, status, model_pool,
             model, replica, _ts(queued_at), _ts(first_token_at), _ts(finished_at)))

    async def get_generation(self, generation_id: str) -> object | None:
        rows = await self.db.execute("SELECT * FROM generations WHERE generation_id = ?", (generation_id,))
        return rows[0] if rows else None

    async def put_usage_day(self, u: UsageDay) -> None:
        """A day's row in ``usage_by_day`` (absolute values), where the days counted before the ledger's totals
        existed are kept."""
        await self.db.execute(
            "INSERT INTO usage_by_day (user_id, day, tokens_in, tokens_out, tokens_cached, replies, updated_at) "
            "VALUES (?, ?, ?, ?, ?, ?, ?)",
            (u.user_id, u.day, u.tokens_in, u.tokens_out, u.tokens_cached, u.replies, datetime.now(UTC)))

    async def usage_counted(self, user_id: str, day: str, generation_id: str) -> bool:
        """Whether the rollup's ledger has this generation in its (user, day)."""
        return bool(await self.db.execute(
            "SELECT generation_id FROM usage_by_generation WHERE user_id = ? AND day = ? AND generation_id = ?",
            (user_id, day, generation_id)))

    async def count_usage(self, user_id: str, day: str, generation_id: str, tokens_in: int, tokens_out: int,
                          tokens_cached: int) -> tuple[UsageDay, bool]:
        """Count one generation's usage in its (user, day), in O(1) statements: its ledger row and the day's new
        totals (static columns of the ledger's partition) are written by one conditional batch, applied only if
        the row is absent and the totals are as read (or as this process last wrote them: no read then). The
        batch is a compare-and-set on a shared aggregate (a redelivery, or the reconciler counting beside the
        agent), not a guard on a new id. The totals are the day's figures (``usage_day`` reads them): nothing
        else is written per reply.
        A batch not applied answers with the partition's totals as they are and whether this generation's row
        is there, so neither a redelivery nor a race costs a read; nor does a user's first reply of a day.
        Returns (the day, whether this generation was new)."""
        this, key = (tokens_in, tokens_out, tokens_cached), (user_id, day)
        known = self._days.pop(key, None)
        if known is None and day >= TOTALS_SINCE:
            known = ((0, 0, 0, 0), None)  # as new: a day with totals refuses the batch and gives them
        while True:
            base, expected = known if known is not None else await self._day_totals(user_id, day)
            total = UsageDay(user_id, day, base[0] + tokens_in, base[1] + tokens_out, base[2] + tokens_cached,
                             base[3] + 1)
            rows = await self._count_once(generation_id, total, this, expected)
            if rows is None:
                self._remember(key, total)
                return total, True
            # Not applied: counted already (a redelivery), or the totals were not as expected (moved under it,
            # or the day was not new). The answer holds the totals as they are; without them, they are read.
            known = _answered_totals(rows)
            if any(getattr(r, "generation_id", None) == generation_id for r in rows):
                if known is None:
                    known = await self._day_totals(user_id, day)
                self._keep(key, known)
                return UsageDay(user_id, day, *known[0]), False

    def _remember(self, key: tuple[str, str], total: UsageDay) -> None:
        self._keep(key, ((total.tokens_in, total.tokens_out, total.tokens_cached, total.replies), total.replies))

    def _keep(self, key: tuple[str, str], totals: Totals) -> None:
        self._days[key] = totals
        if len(self._days) > DAYS_KNOWN:
            self._days.popitem(last=False)

    async def _day_totals(self, user_id: str, day: str) -> Totals:
        """((in, out, cached, replies), the replies the batch expects to find). A partition counted before the
        totals existed has ledger rows and null totals: it is summed this once."""
        rows = await self.db.execute(
            "SELECT day_tokens_in, day_tokens_out, day_tokens_cached, day_replies FROM usage_by_generation "
            "WHERE user_id = ? AND day = ? LIMIT 1", (user_id, day))
        if rows and rows[0].day_replies is not None:
            return (int(rows[0].day_tokens_in or 0), int(rows[0].day_tokens_out or 0),
                    int(rows[0].day_tokens_cached or 0), int(rows[0].day_replies)), int(rows[0].day_replies)
        if not rows:
            return (0, 0, 0, 0), None
        summed = await self.db.execute(
            "SELECT sum(tokens_in), sum(tokens_out), sum(tokens_cached), count(*) FROM usage_by_generation "
            "WHERE user_id = ? AND day = ?", (user_id, day))
        tokens_in, tokens_out, cached, replies = (int(v or 0) for v in summed[0])
        return (tokens_in, tokens_out, cached, replies), None

    async def _count_once(self, generation_id: str, total: UsageDay, this: tuple[int, int, int],
                          expected: int | None) -> list[Any] | None:
        """The conditional batch: the ledger row if absent, and the totals if their replies are still
        ``expected`` (None: no totals yet). None when applied; else the batch's answer (the partition's totals
        as they are, and this generation's row where it exists)."""
        rows = await self.db.atomically([
            ("INSERT INTO usage_by_generation (user_id, day, generation_id, tokens_in, tokens_out, tokens_cached, "
             "counted_at) VALUES (?, ?, ?, ?, ?, ?, ?) IF NOT EXISTS",
             (total.user_id, total.day, generation_id, *this, datetime.now(UTC))),
            ("UPDATE usage_by_generation SET day_tokens_in = ?, day_tokens_out = ?, day_tokens_cached = ?, "
             "day_replies = ? WHERE user_id = ? AND day = ? IF day_replies = ?",
             (total.tokens_in, total.tokens_out, total.tokens_cached, total.replies, total.user_id, total.day,
              expected))])
        return None if rows and rows[0].applied else list(rows)

    async def usage_day(self, user_id: str, day: str) -> UsageDay | None:
        """The day's figures: the ledger's totals, or for a day counted before they existed its
        ``usage_by_day`` row."""
        totals = await self.db.execute(
            "SELECT day_tokens_in, day_tokens_out, day_tokens_cached, day_replies FROM usage_by_generation "
            "WHERE user_id = ? AND day = ? LIMIT 1", (user_id, day))
        if totals and totals[0].day_replies is not None:
            t = totals[0]
            return UsageDay(user_id, day, int(t.day_tokens_in or 0), int(t.day_tokens_out or 0),
                            int(t.day_tokens_cached or 0), int(t.day_replies))
        rows = await self.db.execute(
            "SELECT user_id, day, tokens_in, tokens_out, tokens_cached, replies FROM usage_by_day "
            "WHERE user_id = ? AND day = ?", (user_id, day))
        return UsageDay(*rows[0]) if rows else None

    async def save_summary(self, s: Summary) -> None:
        await self.db.execute(
            "INSERT INTO summaries (conversation_id, upto_turn, summary, tokens, created_at) VALUES (?, ?, ?, ?, ?)",
            (s.conversation_id, s.upto_turn, await self.sealer.seal_text(s.conversation_id, s.summary)
             if self.sealer else s.summary, s.tokens, datetime.now(UTC)))

    async def latest_summary(self, conversation_id: str) -> Summary | None:
        return next(iter(await self.latest_summaries(conversation_id, 1)), None)

    async def latest_summaries(self, conversation_id: str, count: int = 2) -> list[Summary]:
        """The newest ``count`` summaries, newest first (one statement)."""
        rows = await self.db.execute(
            "SELECT conversation_id, upto_turn, summary, tokens FROM summaries WHERE conversation_id = ? LIMIT ?",
            (conversation_id, count))
        out = []
        for row in rows:
            s = Summary(*row)
            text = await self.sealer.open_text(s.conversation_id, s.summary) if self.sealer else s.summary
            if text:
                out.append(Summary(s.conversation_id, s.upto_turn, text, s.tokens))
        return out


def _answered_totals(rows: list[Any]) -> Totals | None:
    """The day's totals in a refused batch's answer, as the next try's base and expectation; None when the
    partition has none (a day counted before they existed, or purged): they are read then."""
    found = next((r for r in rows if getattr(r, "day_replies", None) is not None), None)
    if found is None:
        return None
    return ((int(found.day_tokens_in or 0), int(found.day_tokens_out or 0), int(found.day_tokens_cached or 0),
             int(found.day_replies)), int(found.day_replies))

