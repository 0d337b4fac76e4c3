"""Which partition a key lands on: the Java client's murmur2, as aiokafka's default partitioner.

Readers of ``chat.tokens`` use it to find a generation's partition from its id,
so an SSE event id can be a bare offset.
"""
from __future__ import annotations

from functools import lru_cache

from aiokafka.partitioner import murmur2


@lru_cache(maxsize=8192)
def partition_for(key: str, partitions: int) -> int:
    """Kept for the last 8,192 keys: a generation's records all go to its partition, and aiokafka's murmur2 is
    plain Python (7% of a worker's CPU when it hashed the key of every record)."""
    return (murmur2(key.encode()) & 0x7FFFFFFF) % partitions
