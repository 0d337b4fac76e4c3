"""Which offset a consumer may commit when requests finish out of order.

An offset is committable only when every record before it in that partition has
finished: committing past an unfinished request would lose it if the worker died.
Pure logic; the worker calls ``started``/``finished`` and commits ``committable()``.
"""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class PartitionProgress:
    in_flight: set[int] = field(default_factory=set)
    highest_seen: int = -1

    def next_to_commit(self) -> int | None:
        """Kafka's committed offset is the next one to read: min(in flight) or one past the last seen."""
        if self.in_flight:
            return min(self.in_flight)
        return self.highest_seen + 1 if self.highest_seen >= 0 else None


class OffsetTracker:
    def __init__(self) -> None:
        self._partitions: dict[object, PartitionProgress] = {}
        self._committed: dict[object, int] = {}

    def started(self, tp: object, offset: int) -> None:
        progress = self._partitions.setdefault(tp, PartitionProgress())
        progress.in_flight.add(offset)
        progress.highest_seen = max(progress.highest_seen, offset)

    def finished(self, tp: object, offset: int) -> None:
        progress = self._partitions.get(tp)  # None: revoked meanwhile, the partition's next owner has it
        if progress is not None:
            progress.in_flight.discard(offset)

    def committable(self) -> dict[object, int]:
        """Offsets that moved forward since the last call to ``mark_committed``."""
        out = {}
        for tp, progress in self._partitions.items():
            nxt = progress.next_to_commit()
            if nxt is not None and nxt > self._committed.get(tp, -1):
                out[tp] = nxt
        return out

    def mark_committed(self, offsets: dict[object, int]) -> None:
        self._committed.update(offsets)

    def in_flight(self, tp: object | None = None) -> int:
        if tp is not None:
            return len(self._partitions.get(tp, PartitionProgress()).in_flight)
        return sum(len(p.in_flight) for p in self._partitions.values())

    def forget(self, tps: set[object]) -> None:
        """Partitions revoked in a rebalance: their records now belong to another worker."""
        for tp in tps:
            self._partitions.pop(tp, None)
            self._committed.pop(tp, None)
