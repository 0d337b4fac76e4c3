"""Cassandra statements a run cost, from Cassandra's own counters: the coordinator read, write and range-scan
latency tables of ``system_views`` (Cassandra 4+), which count every statement it coordinated, per table.

Summed over one keyspace, read before and after the run; a private keyspace makes the count the run's own.
"""
from __future__ import annotations

import asyncio
import time

from infra.config.settings import Settings

VIEWS = ("coordinator_read_latency", "coordinator_write_latency", "coordinator_scan_latency")


class StatementCounter:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings

    async def count(self) -> dict[str, int]:
        """{"read|write|scan table": statements so far} in this keyspace; empty when the views cannot be read."""
        return await asyncio.to_thread(self._count)

    async def quiet(self, still_s: float = 4.0, timeout: float = 90.0) -> dict[str, int]:
        """The counters once none has moved for ``still_s`` (the pipeline is done); TimeoutError past ``timeout``."""
        last, still_since, deadline = await self.count(), time.monotonic(), time.monotonic() + timeout
        while time.monotonic() < deadline:
            await asyncio.sleep(0.5)
            now = await self.count()
            if now != last:
                last, still_since = now, time.monotonic()
            elif time.monotonic() - still_since >= still_s:
                return now
        raise TimeoutError(f"Cassandra counters still moving after {timeout:.0f} s")

    def _count(self) -> dict[str, int]:
        from cassandra import DriverException

        from infra.stores.session import connect

        try:
            cluster, session = connect(self.settings, keyspace=None)
        except DriverException:
            return {}
        try:
            out = {}
            for view in VIEWS:
                rows = session.execute(f"SELECT keyspace_name, table_name, count FROM system_views.{view}")
                kind = view.split("_")[1]
                out.update({f"{kind} {r.table_name}": int(r.count) for r in rows
                            if r.keyspace_name == self.settings.keyspace})
            return out
        except DriverException:
            return {}
        finally:
            cluster.shutdown()


def difference(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    """What was counted in between, leaving out what did not move."""
    return {k: after[k] - before.get(k, 0) for k in after if after[k] != before.get(k, 0)}
