"""Every place Parley changes faust's own behaviour, and why: one class per patched defect.

faust-streaming is used for what it does well (agents, tables, changelogs, timers), but a few of its internals
lose or duplicate records under the faults Parley is tested against. Each patch below overrides the smallest
faust method that fixes one defect; ``PATCHES`` lists them with what is lost without the patch and the test
that fails without it. The patches were proven on the faust versions in ``PROVEN_ON`` only: the overridden
methods are private, so ``check_faust_version`` (called by ``streams.app.make_app``) refuses any other version
until the tests below have been run against it and the version added here.
"""
from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from typing import Any

import faust
from faust.tables.manager import TableManager
from faust.tables.recovery import Recovery
from faust.transport.drivers import aiokafka as faust_kafka
from faust.types import TP

from schemas import encode
from schemas.errors import ParleyError
from topics.clients import deadletter_event, log_deadlettered

log = logging.getLogger("streams.app")  # the stages' log lines keep the name they always had

PROVEN_ON = ("0.15.3",)  # faust-streaming versions the tests in PATCHES passed on


@dataclass(frozen=True)
class Patch:
    name: str  # the class below
    overrides: tuple[str, ...]  # the faust methods replaced
    defect: str
    lost_without: str
    tests: tuple[str, ...]  # each fails without the patch


PATCHES = (
    Patch("IdempotentProducer", ("Producer._settings_extra",),
          "faust turns producer idempotence on only inside transactions",
          "a retry after a broker fails over writes a usage record (or a persisted reply) twice",
          ("tests/unit/test_faust_patches.py::test_the_producer_is_idempotent",
           "tests/faults (broker SIGKILL with acknowledged records counted)")),
    Patch("SnapshotFetchThread", ("AIOKafkaConsumerThread.getmany", "AIOKafkaConsumerThread._fetch_records"),
          "aiokafka reads faust's live set of active partitions when records arrive, and an empty set as every "
          "partition",
          "stream records fetched while table recovery paused them are dropped as not active and later committed "
          "unhandled",
          ("tests/unit/test_faust_patches.py::test_the_fetch_gets_a_snapshot_and_an_empty_set_fetches_nothing",
           "tests/integration/test_faust_restarts.py")),
    Patch("HoleRefusingConsumer", ("Consumer._add_gap", "Consumer._new_offset", "Consumer._new_consumer_thread"),
          "faust marks a jump in fetched offsets as handled, and lets a commit pass one unhandled offset right "
          "after the committed one",
          "records never handed to the agent are committed past and never read again",
          ("tests/unit/test_faust_patches.py::test_a_hole_in_the_offsets_stops_the_commit",
           "tests/unit/test_faust_offsets.py", "tests/integration/test_faust_restarts.py")),
    Patch("SeekFirstRecovery", ("Recovery.on_recovery_completed", "TableManager.recovery"),
          "table recovery resumes the stream partitions and only then seeks them to their committed offsets",
          "a table stage restarted while records arrive loses runs of them (27 to 90 offsets of a partition at a "
          "time in runs of SIGKILLed restarts)",
          ("tests/unit/test_faust_patches.py::test_recovery_seeks_before_it_resumes",
           "tests/integration/test_faust_restarts.py")),
    Patch("DeadLetteringTopic", ("Topic.on_value_decode_error", "Topic.derive_topic", "Topic._clone_args"),
          "faust acknowledges an undecodable record and throws the error into the agent, which stops the app",
          "every record after a poison one waits until an operator intervenes; the poison record itself is gone",
          ("tests/unit/test_faust_patches.py::test_derived_topics_keep_their_deadletter_topic",
           "tests/integration/test_faust_agent.py::test_faust_agent_dead_letters_an_undecodable_record_and_goes_on")),
)


class FaustVersionError(ParleyError):
    """The installed faust-streaming is not one the patches were proven on."""


def check_faust_version(installed: str | None = None) -> str:
    """The installed faust-streaming version, or FaustVersionError if the patches were not proven on it."""
    if installed is None:
        try:
            installed = version("faust-streaming")
        except PackageNotFoundError:
            installed = "not installed"
    # A local label marks a repack with upstream's code and other metadata (0.15.3+parley.1: infra/parley).
    if installed.split("+", 1)[0] not in PROVEN_ON:
        raise FaustVersionError(
            f"faust-streaming {installed} is not one the faust patches were proven on ({', '.join(PROVEN_ON)}): "
            "they override private faust methods (streams/faust_patches.py lists them and their tests); run those "
            "tests on this version, then add it to PROVEN_ON"
        )
    return installed


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


class SeekFirstRecovery(Recovery):
    """faust's table recovery resumes the stream partitions, with records flowing, and only then seeks them
    to their committed offsets. Records fetched meanwhile move the consumer's read offset past what the seek
    then sets, the next record looks like a hole in the partition, and faust counts the hole as acknowledged:
    its offsets are committed unhandled. A faust app with a table lost whole runs of records that way across
    restarts (27 to 90 of a partition's offsets at a time, in runs of SIGKILLed restarts with records arriving).
    Here the partitions are sought while still paused, then resumed; the rest is faust's own order."""

    async def on_recovery_completed(self, generation_id: int = 0) -> None:
        app: Any = self.app  # faust's App type leaves out the fetcher its own recovery starts below
        consumer = app.consumer
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
        await app._fetcher.maybe_start()  # as faust's own recovery does
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


class DeadLetteringTopic(faust.Topic):
    """faust acknowledges an undecodable record and hands the error to its agent, which would stop on it;
    here the record is wrapped in ``EventDeadLettered`` on the dead-letter topic instead, as every aiokafka
    stage does (``topics.clients.deadletter``)."""

    deadletter_topic: str | None

    def __init__(self, *args: Any, deadletter_topic: str | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.deadletter_topic = deadletter_topic

    def derive_topic(self, **kwargs: Any) -> faust.TopicT:  # faust copies topics (agents, prefixes): keep ours
        derived = super().derive_topic(**kwargs)
        if isinstance(derived, DeadLetteringTopic):
            derived.deadletter_topic = self.deadletter_topic
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
