"""A faust app wired to Parley's settings and topic catalogue.

Each faust stage is its own app (its own consumer group, named after the stage),
so stages scale and fail independently even when one process hosts them all.
"""
from __future__ import annotations

import asyncio

import faust

from infra.settings import Settings
from streams.codec import CODEC_NAME, register
from topics import Topics


def make_app(stage: str, settings: Settings, **overrides: object) -> faust.App:
    register()
    options: dict[str, object] = dict(
        broker=f"kafka://{settings.kafka_bootstrap}",
        store="memory://",
        datadir=str(settings.state_dir / "faust" / f"{settings.topic_prefix}{stage}"),  # never in the repo
        value_serializer=CODEC_NAME,
        key_serializer="raw",
        topic_replication_factor=1,
        topic_partitions=1,
        web_enabled=False,
        producer_linger_ms=0,
        broker_commit_every=1,
        consumer_auto_offset_reset="earliest",
    )
    options.update(overrides)
    return faust.App(f"{settings.topic_prefix}{stage}", **options)


def topic(app: faust.App, topics: Topics, name: str) -> faust.TopicT:
    """A faust topic for a catalogue name (attribute of ``Topics``), decoded with the event codec."""
    return app.topic(getattr(topics, name), value_serializer=CODEC_NAME, key_serializer="raw", internal=False)


class FaustStage:
    """A faust app run beside the aiokafka stages in one process (same ``run``/``stop`` shape)."""

    def __init__(self, name: str, app: faust.App) -> None:
        self.name, self.app = name, app
        self._stopping: asyncio.Event | None = None

    async def run(self) -> None:
        self._stopping = asyncio.Event()
        await self.app.start()
        try:
            await self._stopping.wait()
        finally:
            await self.app.stop()

    def stop(self) -> None:
        if self._stopping is not None:
            self._stopping.set()
