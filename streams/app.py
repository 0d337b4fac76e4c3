"""A faust app wired to Parley's settings and topic catalogue.

Each faust stage is its own app (its own consumer group, named after the stage),
so stages scale and fail independently even when one process hosts them all. Where Parley changes faust's own
behaviour (its producer, consumer, table recovery and topics), the patch lives in ``streams.faust_patches``.
"""
from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

import faust
from faust.transport import drivers

from infra.config.settings import Settings
from infra.stores.retry import until_stored
from schemas import encode
from streams.codec import CODEC_NAME, register
from streams.faust_patches import DeadLetteringTopic, SeekFirstTableManager, check_faust_version
from topics import Topic, Topics
from topics.clients import deadletter_event, log_deadlettered
from topics.metrics import STAGE_HANDLE_SECONDS, STAGE_RECORDS
from topics.runner import Runner

log = logging.getLogger(__name__)
TRANSPORT = "parley-kafka"  # the broker URL scheme of faust's aiokafka transport with Parley's patches
drivers.TRANSPORTS.aliases[TRANSPORT] = "streams.faust_patches:Transport"


def make_app(stage: str, settings: Settings, **overrides: object) -> faust.App:
    """The faust app of ``stage`` (a catalogue stage name); its id is the stage's consumer group. Refuses a
    faust version its patches (``streams.faust_patches``) were not proven on."""
    check_faust_version()
    register()
    app_id = Topics(settings.topic_prefix).group(stage)
    options: dict[str, Any] = dict(
        broker=[f"{TRANSPORT}://{server}" for server in settings.kafka_bootstrap.split(",")],
        store="memory://",
        datadir=faust_datadir(settings, app_id),
        value_serializer=CODEC_NAME,
        key_serializer="raw",
        topic_replication_factor=settings.kafka_replication,
        topic_partitions=1,
        web_enabled=False,
        producer_linger_ms=0,
        broker_commit_every=1,
        # A killed stages process leaves its members in each group until their session times out, and the
        # restarted one is assigned nothing until then: faust's 60 s default held replies unsaved for a minute
        # after the supervisor's restart. 10 s, with a heartbeat every 3 (Kafka's own third of the session): an
        # idle member asks the broker a third as often as at 1 s, and only a rebalance among several live
        # members (a second stages process joining) waits up to one heartbeat longer to be heard.
        broker_session_timeout=10.0,
        broker_heartbeat_interval=3.0,
        consumer_auto_offset_reset="earliest",
        TableManager=SeekFirstTableManager,
    )
    options.update(overrides)
    app = faust.App(app_id, **options)
    app.sensors.add(StageSensor(stage))
    return app


class StageSensor(faust.Sensor):
    """The same per-stage record count and handling time the aiokafka stages export."""

    def __init__(self, stage: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.records = STAGE_RECORDS.labels(stage=stage, outcome="handled")
        self.seconds = STAGE_HANDLE_SECONDS.labels(stage=stage)

    def on_stream_event_in(self, tp: Any, offset: int, stream: Any, event: Any) -> dict[str, float]:
        return {"began": time.monotonic()}

    def on_stream_event_out(self, tp: Any, offset: int, stream: Any, event: Any,
                            state: dict[str, float] | None = None) -> None:
        self.records.inc()
        if state:
            self.seconds.observe(time.monotonic() - state["began"])


def faust_datadir(settings: Settings, app_id: str) -> str:
    """Faust writes a data folder even with in-memory tables; keep it in the state dir, never the repository."""
    parent = settings.state_dir / "faust"
    parent.mkdir(parents=True, exist_ok=True)  # faust creates only the last level
    return str(parent / app_id)


def topic(app: faust.App, topics: Topics, declared: Topic) -> faust.TopicT:
    """A faust topic for a catalogue topic, decoded with the event codec; a record that does not decode goes
    whole to the dead-letter topic and the agent moves on."""
    return DeadLetteringTopic(app, topics=[getattr(topics, declared.attr)], value_serializer=CODEC_NAME,
                              key_serializer="raw", internal=False, deadletter_topic=topics.deadletter)


async def applied(stage: str, stream: Any, topics: Topics, call: Callable[..., Awaitable[Any]], *args: Any) -> Any:
    """``call(*args)`` for the agent's current record, before faust may acknowledge it: a store outage is
    waited out in place (``until_stored``); any other failure dead-letters the record with its error, so
    the agent neither dies (faust would stop the app) nor drops the record silently. None after that."""
    try:
        return await until_stored(stage, call, *args)
    except Exception as exc:  # noqa: BLE001 - a poison record
        message = stream.current_event.message if stream.current_event is not None else None
        log.exception("stage %s failed on a record; dead-lettering it", stage)
        if message is not None:
            app = stream.app
            event = deadletter_event(message, app.conf.id, f"{type(exc).__name__}: {exc}")
            await app.producer.send_and_wait(topics.deadletter, message.topic.encode(),
                                             encode(event), None, None, None)
            log_deadlettered(event)
        return None


class FaustStage(Runner):
    """A faust app run beside the aiokafka stages in one process: its agents and timers are its loop."""

    def __init__(self, name: str, app: faust.App) -> None:
        super().__init__()
        self.name, self.app = name, app

    def clients(self) -> list[Any]:
        return [self.app]
