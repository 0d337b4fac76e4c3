"""A faust app wired to Parley's settings and topic catalogue.

Each faust stage is its own app (its own consumer group, named after the stage),
so stages scale and fail independently even when one process hosts them all.
"""
from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import faust
from faust.transport import drivers
from faust.transport.drivers import aiokafka as faust_kafka

from infra.config.settings import Settings
from infra.stores.retry import until_stored
from schemas import encode
from streams.codec import CODEC_NAME, register
from topics import Topic, Topics
from topics.clients import deadletter_event, log_deadlettered
from topics.metrics import STAGE_HANDLE_SECONDS, STAGE_RECORDS
from topics.runner import Runner

log = logging.getLogger(__name__)
TRANSPORT = "parley-kafka"  # the broker URL scheme of the transport below


class IdempotentProducer(faust_kafka.Producer):
    """faust's producer asks for ``acks=all`` but turns idempotence on only inside transactions; a retry
    after a broker fails over would then write a usage record twice. Every Parley producer is idempotent."""

    def _settings_extra(self) -> Mapping[str, Any]:
        return {**super()._settings_extra(), "acks": "all", "enable_idempotence": True}


class Transport(faust_kafka.Transport):
    Producer = IdempotentProducer


drivers.TRANSPORTS.aliases[TRANSPORT] = f"{__name__}:Transport"


def make_app(stage: str, settings: Settings, **overrides: object) -> faust.App:
    """The faust app of ``stage`` (a catalogue stage name); its id is the stage's consumer group."""
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
        # after the supervisor's restart. 10 s, as the workers' consumers.
        broker_session_timeout=10.0,
        broker_heartbeat_interval=1.0,
        consumer_auto_offset_reset="earliest",
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


class DeadLetteringTopic(faust.Topic):
    """faust acknowledges an undecodable record and hands the error to its agent, which would stop on it;
    here the record is wrapped in ``EventDeadLettered`` on the dead-letter topic instead, as every aiokafka
    stage does (``topics.clients.deadletter``)."""

    def __init__(self, *args: Any, deadletter_topic: str | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.deadletter_topic = deadletter_topic

    def derive_topic(self, **kwargs: Any) -> faust.TopicT:  # faust copies topics (agents, prefixes): keep ours
        derived = super().derive_topic(**kwargs)
        derived.deadletter_topic = self.deadletter_topic  # type: ignore[attr-defined]
        return derived

    def _clone_args(self) -> Mapping[str, Any]:
        return {**super()._clone_args(), "deadletter_topic": self.deadletter_topic}

    async def on_value_decode_error(self, exc: Exception, message: Any) -> None:
        if self.deadletter_topic is None:
            await super().on_value_decode_error(exc, message)
            return
        event = deadletter_event(message, self.app.conf.id, str(getattr(exc, "__cause__", None) or exc))
        await self.app.producer.send_and_wait(self.deadletter_topic, message.topic.encode(), encode(event),
                                              None, None, None)
        log_deadlettered(event)


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
