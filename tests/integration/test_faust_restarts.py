"""A faust stage with a table, SIGKILLed and restarted while records keep arriving, on real Kafka: every
record is handled. faust's own recovery lost whole runs of them (a partition's records published while the
stage was down were committed unhandled: its recovery sought the partitions with records already flowing,
and aiokafka, handed faust's emptied set of active partitions, returned every partition's records, which
faust dropped). The usage rollup is such a stage: after the fault suite's stages SIGKILL a day row held
1 reply of 2."""
from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from infra.config.settings import Settings
from tests.integration.faust_restart_app import PARTITIONS, SOURCE
from topics.clients import make_producer

RESTARTS = 4


def handled(out: Path) -> set[int]:
    return {int(line) for line in out.read_text().split()} if out.exists() else set()


async def test_records_published_across_sigkilled_restarts_are_all_handled(settings: Settings,
                                                                           tmp_path: Path) -> None:
    prefix, bootstrap = settings.topic_prefix, settings.kafka_bootstrap
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(prefix + SOURCE, PARTITIONS, settings.kafka_replication)])
    finally:
        await admin.close()
    out, log = tmp_path / "handled.txt", (tmp_path / "stage.log").open("ab")
    root = Path(__file__).resolve().parents[2]

    def start() -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            [sys.executable, "-m", "tests.integration.faust_restart_app", bootstrap, str(settings.kafka_brokers),
             prefix, str(tmp_path / "state"), str(out)], cwd=root, stdout=log, stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONPATH": str(root)})

    producer = make_producer(bootstrap)
    await producer.start()
    sent = 0

    async def publish(seconds: float) -> None:
        nonlocal sent
        until = time.monotonic() + seconds
        while time.monotonic() < until:
            await producer.send_and_wait(prefix + SOURCE, str(sent).encode(), key=f"user{sent % 40}".encode())
            sent += 1
            await asyncio.sleep(0.02)

    stage = start()
    try:
        await publish(8)
        for _ in range(RESTARTS):
            stage.send_signal(signal.SIGKILL)
            stage.wait()
            await publish(2)  # while it is down
            stage = start()
            await publish(8)  # while the restarted stage rejoins, recovers its table and catches up
        until = time.monotonic() + 60
        while time.monotonic() < until and len(handled(out)) < sent:
            await asyncio.sleep(1)
    finally:
        stage.send_signal(signal.SIGKILL)
        stage.wait()
        await producer.stop()
        log.close()
    missing = sorted(set(range(sent)) - handled(out))
    assert sent > 200  # records arrived before, during and after every restart (about 50 a second here)
    assert missing == [], f"{len(missing)} of {sent} records never handled, from {missing[:20]}"
