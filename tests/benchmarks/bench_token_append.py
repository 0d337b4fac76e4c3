"""What handing one token record to the producer costs the worker: aiokafka partitioning each record by its key
(murmur2 in Python, two lists of the topic's partitions built per send) against the worker naming the
generation's partition (``Appender.partition``, the same partition, hashed once per generation).

Both in one run, alternating rounds, against the Kafka of ``parley up``, on a ``chat.tokens`` of a private prefix
(made for the run, deleted after it: the service's readers see none of it): 64 generations of 40 records each per
round, a ~300-byte value (a sealed three-token record), every record acknowledged before the round ends. The
figure is the process's CPU per record (the producer's sending and acknowledging included).

    python -m tests.benchmarks.bench_token_append [--rounds 6]
"""
from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time

from consumers.generation.appending import Appender
from infra.config.settings import Settings
from schemas import new_id
from topics import Topics
from topics.admin import delete_prefixed_async, ensure_topics_async

GENERATIONS, RECORDS = 64, 40
VALUE = b"x" * 300


async def one_round(appender: Appender, topic: str, named: bool) -> float:
    """CPU seconds per record for one round."""
    keys = [new_id() for _ in range(GENERATIONS)]
    began = time.process_time()
    futures = []
    for _ in range(RECORDS):
        for key in keys:
            partition = appender.partition(topic, key) if named else None
            futures.append(await appender.producer.send(topic, VALUE, key=key.encode(), partition=partition))
    await asyncio.gather(*futures)
    return (time.process_time() - began) / (GENERATIONS * RECORDS)


async def main(rounds: int) -> None:
    settings = Settings.from_env()
    prefix = f"bench{os.getpid()}."
    await ensure_topics_async(settings.kafka_bootstrap, prefix, ["large"])
    topic = Topics(prefix).tokens
    appender = Appender(settings.kafka_bootstrap, f"bench-{os.getpid()}")
    await appender.producer.start()
    try:
        await one_round(appender, topic, False)  # metadata fetched, connections warm
        got: dict[bool, list[float]] = {False: [], True: []}
        for _ in range(rounds):
            for named in (False, True):
                got[named].append(await one_round(appender, topic, named))
    finally:
        await appender.producer.stop()
        await delete_prefixed_async(settings.kafka_bootstrap, prefix)
    by_key, named = statistics.median(got[False]) * 1e6, statistics.median(got[True]) * 1e6
    print(f"CPU per token record handed to the producer and acknowledged, median of {rounds} rounds "
          f"({GENERATIONS} generations x {RECORDS} records each)")
    print(f"{'partitioned by key':>22}{'partition named':>18}{'ratio':>8}")
    print(f"{by_key:>19.1f} µs{named:>15.1f} µs{named / by_key:>8.2f}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=6)
    asyncio.run(main(parser.parse_args().rounds))
