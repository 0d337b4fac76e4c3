"""A faust app wired to Parley's settings and topic catalogue.

Each faust stage is its own app (its own consumer group, named after the stage),
so stages scale and fail independently even when one process hosts them all.
"""
from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import faust
from faust.tables.manager import TableManager
from faust.tables.recovery import Recovery
from faust.transport import drivers
from faust.transport.drivers import aiokafka as faust_kafka
from faust.types import TP

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


class SnapshotFetchThread(faust_kafka.AIOKafkaConsumerThread):
    """faust asks aiokafka for the records of its live, mutable set of active partitions, through a queue,
    and aiokafka reads that set when records arrive, not when asked. When the set emptied meanwhile (table
    recovery pauses its changelog partitions), aiokafka read "no partitions" as "every partition" and returned
    the stream partitions' records too; faust dropped them as not active, aiokafka had moved past them, and
    their offsets were later committed unhandled. Here aiokafka gets the set as it was when faust asked, and
    an empty set fetches nothing."""

    async def getmany(self, active_partitions: set[TP] | None, timeout: float) -> Any:
        asked = None if active_partitions is None else set(active_partitions)  # a copy nobody else changes
        return await super().getmany(asked, timeout)

    async def _fetch_records(self, consumer: Any, active_partitions: set[TP], timeout: float | None = None,
                             max_records: int | None = None) -> Any:
        if active_partitions is not None and not active_partitions:
            return {}  # aiokafka would read an empty set as every partition
        return await super()._fetch_records(consumer, active_partitions, timeout=timeout, max_records=max_records)


class HoleRefusingConsumer(faust_kafka.Consumer):
    """A stage's commit never passes an offset it did not handle. The topics Parley's faust stages read have
    no gaps (delete cleanup, idempotent producers, no transactions), so a jump in the offsets fetched means
    records were dropped on the way; faust would mark the hole handled and commit past it. Here the hole is
    logged and left unacknowledged: the commit stops before it, and the records are read again after a restart
    or rebalance instead of being lost."""

    def _new_consumer_thread(self) -> faust_kafka.AIOKafkaConsumerThread:
        return SnapshotFetchThread(self, loop=self.loop, beacon=self.beacon)

    async def _add_gap(self, tp: TP, offset_from: int, offset_to: int) -> None:
        log.error("faust consumer %s: offsets %d..%d of %s partition %d were never handed to the stage; the "
                  "commit stays before them", self.app.conf.id, offset_from, offset_to, tp.topic, tp.partition)

    def _new_offset(self, tp: TP) -> int | None:
        # faust lets the commit pass a single unhandled offset right after the committed one (it compares with
        # "> 1"; the committed offset is the next one to read, so any difference is a hole).
        acked, committed = self._acked[tp], self._committed_offset[tp]
        if acked and committed is not None and min(acked) > committed:
            return None
        return super()._new_offset(tp)


class Transport(faust_kafka.Transport):
    Consumer = HoleRefusingConsumer
    Producer = IdempotentProducer


drivers.TRANSPORTS.aliases[TRANSPORT] = f"{__name__}:Transport"


class SeekFirstRecovery(Recovery):
    """faust's table recovery resumes the stream partitions, with records flowing, and only then seeks them
    to their committed offsets. Records fetched meanwhile move the consumer's read offset past what the seek
    then sets, the next record looks like a hole in the partition, and faust counts the hole as acknowledged:
    its offsets are committed unhandled. A faust app with a table lost whole runs of records that way across
    restarts (27 to 90 of a partition's offsets at a time, in runs of SIGKILLed restarts with records arriving).
    Here the partitions are sought while still paused, then resumed; the rest is faust's own order."""

    async def on_recovery_completed(self, generation_id: int = 0) -> None:
        app, consumer = self.app, self.app.consumer
        self.log.info("Restore complete!")
        await app.on_rebalance_complete.send()
        self._set_recovery_ended()
        done = [asyncio.ensure_future(table.on_recovery_completed(self.actives_for_table[table],
                                                                  self.standbys_for_table[table]))
                for table in self.tables.values()]
        if done:
            await asyncio.wait(done)
        assignment = consumer.assignment()
        if app.consumer_generation_id != generation_id:
            self.log.warning("Recovery rebalancing again app id %s param %s", app.consumer_generation_id,
                             generation_id)
            return
        if assignment:
            self.log.info("Seek stream partitions to committed offsets (still paused).")
            await self._wait(consumer.perform_seek(), timeout=app.conf.broker_request_timeout)
        consumer.resume_partitions({tp for tp in assignment if not self._is_changelog_tp(tp)})
        self.completed.set()
        app.flow_control.resume()
        consumer.resume_flow()
        await app._fetcher.maybe_start()  # type: ignore[attr-defined]  # as faust's own recovery does
        self.tables.on_actives_ready()
        if not app.assignor.assigned_standbys():
            self.tables.on_standbys_ready()
        app.on_rebalance_end()
        self.log.info("Worker ready")


class SeekFirstTableManager(TableManager):
    @property
    def recovery(self) -> Recovery:
        if self._recovery is None:
            self._recovery = SeekFirstRecovery(self.app, self, beacon=self.beacon, loop=self.loop)
        return self._recovery


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
