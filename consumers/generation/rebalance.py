"""What a worker does when the pool's consumer group moves partitions: commit what finished, then let go of
every reply whose request is on a revoked partition before the rebalance goes on.

Stopping them first matters: the partition's next owner (another worker, or this one if it gets the partition
back) re-reads the uncommitted request and resumes the reply from its saved tokens. Without it, two workers
would append to one generation until the old one met its fence, and a client could be shown the old owner's
tokens past the point the new owner resumed from. Kafka's eager rebalance revokes every partition, so a worker
joining or leaving the pool restarts each reply in flight once (from its saved tokens); the sticky assignor
(``assignor.py``) gives most partitions back to the same worker, whose prefix cache still holds the prompt.
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import TYPE_CHECKING, Any

from aiokafka import ConsumerRebalanceListener, TopicPartition

from consumers.generation import appending
from consumers.generation.intake import partition_prefix

if TYPE_CHECKING:
    from consumers.generation.worker import GenerationWorker

log = logging.getLogger(__name__)


class Rebalance(ConsumerRebalanceListener):
    def __init__(self, worker: GenerationWorker) -> None:
        self.worker = worker

    async def on_partitions_revoked(self, revoked: set[TopicPartition]) -> None:
        await self.worker.intake.commit()
        await let_go(self.worker.active, set(revoked), self.worker.producer, self.worker.worker_id)
        self.worker.intake.forget(set(revoked))

    async def on_partitions_assigned(self, assigned: set[TopicPartition]) -> None:
        log.info("worker %s assigned %s", self.worker.worker_id, sorted(f"{t.topic}[{t.partition}]" for t in assigned))


async def let_go(active: dict[str, asyncio.Task[None]], revoked: set[TopicPartition], producer: Any,
                 worker_id: str) -> None:
    """Stop every generation in ``active`` (keyed ``topic:partition:offset``) whose request is on a revoked
    partition, and wait until none of them can append again."""
    prefixes = tuple(partition_prefix(tp) for tp in revoked)
    tasks = [task for key, task in active.items() if key.startswith(prefixes) and not task.done()]
    if not tasks:
        return
    for task in tasks:
        task.cancel()  # vLLM aborts the sequence when its stream is closed
    await asyncio.gather(*tasks, return_exceptions=True)
    with contextlib.suppress(TimeoutError):  # a producer stuck on a lost broker must not hold the rebalance
        await asyncio.wait_for(producer.flush(), appending.ACK_TIMEOUT_S)  # in the log before the next owner
    log.info("worker %s let go of %d generation(s) on revoked partitions; their next owner resumes them",
             worker_id, len(tasks))
