"""Which partition a key lands on: the Java client's murmur2, as aiokafka's default partitioner.

Readers of ``chat.tokens`` use it to find a generation's partition from its id,
so an SSE event id can be a bare offset.
"""
from __future__ import annotations

from aiokafka.partitioner import murmur2


def partition_for(key: str, partitions: int) -> int:
    return (murmur2(key.encode()) & 0x7FFFFFFF) % partitions
