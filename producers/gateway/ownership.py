"""Which partitions of ``chat.tokens`` a gateway tails, and generation ids that land on them.

Gateway i of N owns the partitions p with p % N == i. An index past N - 1 is taken modulo N: the gateways of a
StatefulSet that an autoscaler grew past N share their partitions with the first N (each such partition is then
read by two of them), and none needs restarting when the count changes. Every event of a generation is keyed
by its id, so the gateway that accepts a message draws ids until one falls on a partition it owns: the reply's
token records then reach only the one gateway that serves its stream, and each gateway's tail grows with its own
streams, not with the fleet. With 6 partitions and N gateways a draw succeeds with chance |owned| / 6 (half a draw
more on average at N = 2, 5 more at N = 4: microseconds, once per message).
"""
from __future__ import annotations

from collections.abc import Callable

from schemas import new_id
from schemas.errors import ParleyError
from topics.partitioning import partition_for

MAX_DRAWS = 10_000  # 1 - (1 - 1/partitions) ** 10_000 is 1 for any topic this side of 10,000 partitions


class NoPartitions(ParleyError, ValueError):
    """More gateways than partitions: this one would own none."""


def owned(index: int, count: int, partitions: int) -> frozenset[int]:
    if count < 1 or index < 0:
        raise ValueError(f"gateway index {index} of {count}: the index must be 0 or more and the count 1 or more")
    index %= count
    mine = frozenset(p for p in range(partitions) if p % count == index)
    if not mine:
        raise NoPartitions(f"gateway {index} of {count} owns no partition of a topic with {partitions}: "
                           f"run at most {partitions} gateways or give the token topic more partitions")
    return mine


def mint(mine: frozenset[int], partitions: int, draw: Callable[[], str] = new_id) -> str:
    """A fresh id whose records land on one of ``mine``; ids stay time-ordered (each draw is a ``new_id``)."""
    for _ in range(MAX_DRAWS):
        candidate = draw()
        if partition_for(candidate, partitions) in mine:
            return candidate
    raise RuntimeError(f"no id in {MAX_DRAWS} draws fell on partitions {sorted(mine)} of {partitions}")
