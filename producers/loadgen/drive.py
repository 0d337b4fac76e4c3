"""The open loop: each scheduled arrival becomes a request at its time, whether earlier ones are done or not.

Bounded in count (the schedule's length), in time (arrivals stop at the schedule's end; streams still open
``drain_s`` later are cut and recorded as such) and in connections (``max_in_flight``: an arrival past it is
recorded as refused by the client, not sent, so a stuck service cannot make the load generator grow without
bound).
"""
from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

from producers.loadgen.client import ChatClient
from producers.loadgen.record import RequestRecord
from producers.loadgen.workload import Turn, Workload

CLIENT_CAP = "client_in_flight_cap"
CUT = "cut_at_drain"


@dataclass
class Progress:
    """What the sampler reads while the load runs."""

    started: float = 0.0
    sent: int = 0
    in_flight: int = 0
    finished: int = 0


async def play(times: list[float], workload: Workload, client: ChatClient, drain_s: float,
               max_in_flight: int, progress: Progress) -> list[RequestRecord]:
    """Run the schedule (offsets in seconds); every arrival's record, in arrival order."""
    progress.started = start = time.time()
    records: list[RequestRecord] = []
    tasks: dict[asyncio.Task[None], RequestRecord] = {}
    for i, offset in enumerate(times):
        await asyncio.sleep(max(0.0, start + offset - time.time()))
        turn = workload.next_turn()
        record = RequestRecord(i, turn.conversation.user.plan, turn.number, sent=time.time())
        records.append(record)
        if progress.in_flight >= max_in_flight:
            record.error = CLIENT_CAP
            workload.finished(turn)
            continue
        progress.sent += 1
        progress.in_flight += 1
        tasks[asyncio.create_task(_one(client, workload, turn, record, progress))] = record
    end = (start + times[-1] if times else start) + drain_s
    pending = [t for t in tasks if not t.done()]
    if pending:
        _, late = await asyncio.wait(pending, timeout=max(0.0, end - time.time()))
        for task in late:
            tasks[task].error = CUT
            task.cancel()
        await asyncio.gather(*late, return_exceptions=True)
    return records


async def _one(client: ChatClient, workload: Workload, turn: Turn, record: RequestRecord,
               progress: Progress) -> None:
    try:
        await client.send(turn, record)
    finally:
        progress.in_flight -= 1
        progress.finished += 1
        workload.finished(turn)
