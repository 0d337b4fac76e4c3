"""A time series taken once a second while the load runs: the client's streams in flight and the engine's
and stages' own gauges (sequences running and waiting, KV use, consumer lag), for the PNG and for the peaks."""
from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any

import httpx

from producers.loadgen import scrape
from producers.loadgen.drive import Progress


@dataclass
class Sampler:
    progress: Progress
    worker_metrics: dict[str, str]  # pool -> its worker's /metrics URL
    stages_metrics: str | None
    prefix: str = ""  # the deployment's topic prefix, left off group names
    rows: list[dict[str, Any]] = field(default_factory=list)
    _task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="loadgen-sampler")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def _run(self) -> None:
        async with httpx.AsyncClient() as http:
            while True:
                began = time.monotonic()
                self.rows.append(await self.sample(http))
                await asyncio.sleep(max(0.0, 1.0 - (time.monotonic() - began)))

    async def sample(self, http: httpx.AsyncClient) -> dict[str, Any]:
        row: dict[str, Any] = {"t": time.time() - (self.progress.started or time.time()),
                               "in_flight": self.progress.in_flight, "sent": self.progress.sent,
                               "finished": self.progress.finished}
        for pool, url in self.worker_metrics.items():
            got = await scrape.fetch(http, url, scrape.ENGINE)
            row[f"{pool}.running"] = scrape.total(got, "parley_worker_running_sequences")
            row[f"{pool}.waiting"] = scrape.total(got, "parley_worker_waiting_sequences")
            row[f"{pool}.kv"] = scrape.total(got, "parley_worker_kv_cache_usage_ratio")
            row[f"{pool}.tokens"] = scrape.total(got, "parley_worker_tokens_total")
        if self.stages_metrics:
            lag = await scrape.fetch(http, self.stages_metrics, scrape.STAGES)
            lags: dict[str, float] = {}
            for key, value in lag.items():
                group = _group(key, self.prefix)
                lags[group] = lags.get(group, 0.0) + value
            row["lag"] = lags
        return row


def _group(key: str, prefix: str) -> str:
    """'name{group="p.admission",topic="..."}' -> 'admission'."""
    group = key.split('group="', 1)[-1].split('"', 1)[0]
    return group.removeprefix(prefix)
