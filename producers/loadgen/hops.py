"""Where a request's time to first token went, hop by hop, from the events' own timestamps.

A tap (a consumer with no group, every partition, from the end) on the topics between the gateway and the
worker keeps, per generation, when each event was made: ``MessageSubmitted`` (gateway), ``RequestAdmitted``
(admission), ``PromptBuilt`` (prompt build), ``GenerationRequested`` (scheduler), and from
``GenerationFinished`` the worker's pick-up and first token. With the client's send and first delta these
make the hops below; each process stamps with its own clock, which here is one machine's.

The tap also keeps when each token record was handed to Kafka (the record's own timestamp, read without decoding
it), per generation: the gaps between them are the stream as the worker wrote it, so a stutter the client sees
can be told apart as the engine's and the worker's (there already) or delivery's (added after).
"""
from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import Iterable

from producers.loadgen.record import RequestRecord
from schemas import (
    EventDecodeError,
    GenerationFinished,
    GenerationRequested,
    MessageSubmitted,
    PromptBuilt,
    RequestAdmitted,
    decode,
)
from schemas.scheduler import LANES
from topics import Topics
from topics.clients import assign_at_end, make_consumer

TOKEN_RECORD = b'{"type":"TokensAppended"'  # how a token record's value starts (the codec writes the tag first)
HOPS = ("gateway", "admission", "prompt", "scheduler", "queue", "engine_first_token", "delivery")
MARKS = (MessageSubmitted, RequestAdmitted, PromptBuilt, GenerationRequested)
# The latency budget: each hop's p50 at one stream, ms (docs/performance.md, "Latency budget per hop"). The
# pipeline's hops sum to 20 ms, inside the 30 ms Parley may add to the engine's own first token as `parley up`
# starts it; the engine's first token is the engine's, not the pipeline's, so it has no budget here.
BUDGET_MS: dict[str, float] = {"gateway": 3.0, "admission": 3.0, "prompt": 5.0, "scheduler": 2.0, "queue": 2.0,
                               "delivery": 5.0}


def hop_times(record: RequestRecord, marks: dict[str, float]) -> dict[str, float] | None:
    """Each hop's seconds for one request, or None when an event is missing (refused, not seen)."""
    need = [m.__name__ for m in MARKS] + ["started_at", "first_token_at"]
    if not record.deltas or any(not marks.get(k) for k in need):
        return None
    points = [record.sent, *(marks[k] for k in need), record.deltas[0]]
    return dict(zip(HOPS, (b - a for a, b in itertools.pairwise(points)), strict=True))


def record_gaps(appended: dict[bytes, list[float]]) -> list[float]:
    """Seconds between consecutive token records of each generation, as they were handed to Kafka."""
    return [b - a for times in appended.values() for a, b in itertools.pairwise(sorted(times))]


class HopTap:
    def __init__(self, bootstrap: str, prefix: str, pools: Iterable[str]) -> None:
        names = Topics(prefix)
        self.tokens = names.tokens
        self.topics = [names.requests, names.admitted, names.prompts, names.replies, names.tokens,
                       *(names.generate(p, lane) for p in pools for lane in LANES)]
        # The tap reads times the events and records carry, never when it reads them: the broker holds its fetch
        # until a megabyte or 250 ms has gathered. Answered at the first byte, it fetched once per record of every
        # topic it reads (3,006 of the broker's 10,700 fetches in a 20 s replica run), and the service's Kafka
        # figures carried the tap's work.
        self.consumer = make_consumer(bootstrap, group_id=None, fetch_max_wait_ms=250, fetch_min_bytes=1 << 20)
        self.marks: dict[str, dict[str, float]] = {}
        self.appended: dict[bytes, list[float]] = {}  # generation id (the key) -> each token record's timestamp, s
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        await self.consumer.start()
        await assign_at_end(self.consumer, self.topics)  # nothing produced after start() is skipped
        self._task = asyncio.create_task(self._run(), name="hop-tap")

    async def _run(self) -> None:
        while True:
            batch = await self.consumer.getmany(timeout_ms=200, max_records=2000)
            for tp, records in batch.items():
                for r in records:
                    if tp.topic != self.tokens:
                        self._keep(r.value, r.key)
                    elif r.value.startswith(TOKEN_RECORD) and r.key is not None:
                        self.appended.setdefault(r.key, []).append(r.timestamp / 1000)

    def _keep(self, raw: bytes, key: bytes | None = None) -> None:
        try:
            event = decode(raw, key=key)
        except EventDecodeError:
            return
        gid = getattr(event, "generation_id", "")
        marks = self.marks.setdefault(gid, {})
        if isinstance(event, GenerationFinished):
            marks.update(started_at=event.started_at, first_token_at=event.first_token_at, finished=event.at)
        elif isinstance(event, MARKS):
            marks.setdefault(type(event).__name__, event.at)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        await self.consumer.stop()
