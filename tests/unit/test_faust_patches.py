"""One test per faust patch (streams/faust_patches.py), each failing on faust's own class, and the start-up
check that refuses a faust version the patches were not proven on."""
from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import faust
import pytest
from faust.transport.drivers import aiokafka as faust_kafka
from faust.types import TP

import streams.faust_patches as patches
from infra.config.settings import Settings
from schemas.errors import ParleyError
from streams.app import make_app, topic
from streams.faust_patches import (
    PATCHES,
    PROVEN_ON,
    DeadLetteringTopic,
    FaustVersionError,
    HoleRefusingConsumer,
    IdempotentProducer,
    SeekFirstRecovery,
    SnapshotFetchThread,
    check_faust_version,
)
from topics import Topics
from topics.catalogue import REPLIES

TPART = TP("t.usage", 0)


def app(tmp_path: Path) -> faust.App:
    return make_app("usage-rollup", Settings(state_dir=tmp_path))


def test_every_patch_is_listed_with_its_tests() -> None:
    for patch in PATCHES:
        assert isinstance(getattr(patches, patch.name), type), patch.name
        assert patch.tests and patch.lost_without and patch.overrides


def test_the_producer_is_idempotent(tmp_path: Path) -> None:
    producer = app(tmp_path).producer
    assert isinstance(producer, IdempotentProducer)
    assert not producer.app.in_transaction  # faust's own producer asks for idempotence only in a transaction
    extra = producer._settings_extra()
    assert extra["enable_idempotence"] is True and extra["acks"] == "all"


async def test_the_fetch_gets_a_snapshot_and_an_empty_set_fetches_nothing(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    asked: list[Any] = []

    async def getmany(self: Any, active: Any, timeout: float) -> dict[TP, list[Any]]:
        asked.append(active)
        return {}

    async def fetch_records(self: Any, consumer: Any, active: Any, timeout: float | None = None,
                            max_records: int | None = None) -> dict[TP, list[Any]]:
        asked.append(active)
        return {TPART: ["a record of a partition nobody asked for"]}

    monkeypatch.setattr(faust_kafka.AIOKafkaConsumerThread, "getmany", getmany)
    monkeypatch.setattr(faust_kafka.AIOKafkaConsumerThread, "_fetch_records", fetch_records)
    thread = app(tmp_path).consumer._new_consumer_thread()
    assert isinstance(thread, SnapshotFetchThread)
    live = {TPART}
    await thread.getmany(live, 0.0)
    assert asked == [live] and asked[0] is not live  # later changes to faust's live set do not reach aiokafka
    assert await thread._fetch_records(object(), set(), timeout=0.0) == {}
    assert len(asked) == 1  # aiokafka was never asked: it reads an empty set as every partition


def test_a_hole_in_the_offsets_stops_the_commit(tmp_path: Path) -> None:
    consumer = app(tmp_path).consumer
    assert isinstance(consumer, HoleRefusingConsumer)
    consumer._committed_offset[TPART] = 10  # the next offset to read
    consumer._acked[TPART] = [11]  # 10 was never handled; faust would commit 12
    assert consumer._new_offset(TPART) is None


async def test_recovery_seeks_before_it_resumes(tmp_path: Path) -> None:
    recovery = app(tmp_path).tables.recovery
    assert isinstance(recovery, SeekFirstRecovery)
    calls: list[str] = []

    async def nothing(*args: Any) -> None:
        return None

    async def seek() -> None:
        calls.append("seek")

    async def wait(coro: Any, timeout: float | None = None) -> None:
        await coro

    consumer = SimpleNamespace(assignment=lambda: {TPART}, perform_seek=seek,
                               resume_partitions=lambda tps: calls.append("resume"),
                               resume_flow=lambda: calls.append("flow"))
    recovery.app = SimpleNamespace(  # type: ignore[assignment]
        consumer=consumer, on_rebalance_complete=SimpleNamespace(send=nothing), consumer_generation_id=0,
        conf=SimpleNamespace(broker_request_timeout=1.0), flow_control=SimpleNamespace(resume=lambda: None),
        _fetcher=SimpleNamespace(maybe_start=nothing), assignor=SimpleNamespace(assigned_standbys=lambda: set()),
        on_rebalance_end=lambda: None, in_recovery=True)
    recovery.tables = SimpleNamespace(  # type: ignore[assignment]
        values=lambda: [], changelog_topics=set(), on_actives_ready=lambda: None, on_standbys_ready=lambda: None)
    recovery._wait = wait  # type: ignore[method-assign]
    await recovery.on_recovery_completed(0)
    assert calls == ["seek", "resume", "flow"]  # faust's own order resumes first, then seeks


def test_derived_topics_keep_their_deadletter_topic(tmp_path: Path) -> None:
    topics = Topics("t.")
    declared = topic(app(tmp_path), topics, REPLIES)
    derived = declared.derive_topic(topics=["t.other"])
    assert isinstance(derived, DeadLetteringTopic)
    assert derived.deadletter_topic == topics.deadletter
    cloned = declared.clone()
    assert isinstance(cloned, DeadLetteringTopic) and cloned.deadletter_topic == topics.deadletter


def test_a_faust_version_the_patches_were_not_proven_on_is_refused(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    assert check_faust_version().split("+")[0] in PROVEN_ON  # the installed one (repacked: 0.15.3+parley.1)
    assert check_faust_version("0.15.3+parley.1") == "0.15.3+parley.1"  # upstream's code, other metadata
    with pytest.raises(FaustVersionError, match="0.16.0"):
        check_faust_version("0.16.0")
    with pytest.raises(FaustVersionError):
        check_faust_version("0.15.30")
    monkeypatch.setattr(patches, "version", lambda name: "0.16.0")
    with pytest.raises(ParleyError):
        app(tmp_path)
