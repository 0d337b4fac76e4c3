"""A faust stage shaped like the usage rollup (an agent that writes a table and re-keys to an internal topic),
run as its own process so a test can SIGKILL it: every record it handles is appended, fsynced, to a file.

    python -m tests.integration.faust_restart_app <bootstrap> <brokers> <topic prefix> <state dir> <out file>
"""
from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

from infra.config.settings import Settings
from streams.app import make_app

SOURCE, PARTITIONS = "restart-source", 6


def main(bootstrap: str, brokers: int, prefix: str, state_dir: str, out_file: str) -> None:
    settings = Settings(kafka_servers=bootstrap, kafka_brokers=brokers, topic_prefix=prefix,
                        state_dir=Path(state_dir))
    # The group's shortest session the broker allows: the killed process's member leaves within 6 s.
    app = make_app("usage-rollup", settings, broker_session_timeout=6.0)
    source = app.topic(prefix + SOURCE, partitions=PARTITIONS, value_serializer="raw", key_serializer="raw")
    counts = app.Table("counts", default=int, partitions=PARTITIONS)
    rekeyed = app.topic(prefix + "restart-rekeyed", internal=True, partitions=PARTITIONS, value_serializer="raw",
                        key_serializer="raw")
    out = open(out_file, "a", buffering=1)  # noqa: SIM115 - open for the process's life

    @app.agent(source)
    async def handle(stream):  # type: ignore[no-untyped-def]
        async for value in stream:
            await asyncio.sleep(0.002)  # a store write
            out.write(value.decode() + "\n")
            out.flush()
            os.fsync(out.fileno())
            await rekeyed.send(key=b"all", value=value)

    @app.agent(rekeyed)
    async def count(stream):  # type: ignore[no-untyped-def]
        async for _ in stream:
            counts["all"] += 1

    async def run() -> None:
        await app.start()
        print("started", flush=True)
        await asyncio.Event().wait()

    asyncio.run(run())


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5])
