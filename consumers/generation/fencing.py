"""Owner epochs: a worker presumed dead (paused by SIGSTOP or a long stall, its generation moved to
another worker) cannot append to a generation it no longer owns.

Each worker that takes a generation on increments ``parley:gen:<id>:epoch`` and stamps the value on
every ``GenerationStarted``, ``TokensAppended`` and ``GenerationFinished`` it writes. Readers (the
gateway's streams, recovery, persistence) drop events of an epoch older than one they have seen. A worker
re-checks its epoch after any pause between steps and before finishing, and stops when it was fenced off.
"""
from __future__ import annotations

import logging
from typing import Any

from infra.stores import keys

log = logging.getLogger(__name__)
EPOCH_TTL_S = 24 * 3600
STARTED_TTL_S = 900  # the started marker: as long as a reply's tokens can be resumed from the log


class Fence:
    def __init__(self, redis: Any) -> None:
        self.redis = redis
        self.epochs: dict[str, int] = {}  # generation_id -> the epoch this worker holds it under

    def epoch(self, generation_id: str) -> int:
        return self.epochs.get(generation_id, 0)

    async def take(self, generation_id: str, started_ms: int | None = None) -> tuple[int, int | None]:
        """Take ``generation_id`` on under the next epoch; the epoch and the generation's started marker as it
        was (None: no owner before this one got as far as its pick-up). With ``started_ms`` the marker is set
        in the same round trip when there is none (``SET NX``): recovery reads saved tokens only once it is set,
        so it is set before this worker can append any, and the first token waits on no Redis write."""
        key = keys.generation_epoch(generation_id)
        started = keys.generation_started(generation_id)
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.incr(key)
            pipe.expire(key, EPOCH_TTL_S)
            pipe.get(started)
            if started_ms is not None:
                pipe.set(started, started_ms, ex=STARTED_TTL_S, nx=True)
            epoch, _, was, *_ = await pipe.execute()
        self.epochs[generation_id] = int(epoch)
        return int(epoch), None if was is None else int(was)

    def release(self, generation_id: str) -> None:
        self.epochs.pop(generation_id, None)

    async def fenced(self, generation_id: str) -> bool:
        """Whether another worker took this generation over since this one did."""
        current = await self.redis.get(keys.generation_epoch(generation_id))
        if current is None or int(current) <= self.epoch(generation_id):
            return False
        log.warning("generation %s: fenced off (held epoch %d, now %s); stopping without appending",
                    generation_id, self.epoch(generation_id), current.decode())
        return True


def is_current(event: object, seen_epoch: int) -> bool:
    """For a reader that has seen ``seen_epoch``: whether ``event`` is from the current owner or newer.
    Epoch 0 is no owner's (the scheduler's own finish, queue events): never fenced."""
    epoch = getattr(event, "epoch", 0)
    return epoch == 0 or epoch >= seen_epoch
