"""The reaper's logic with a fake quota and a stand-in replay: settle from the reply when there is one,
release charging nothing when there is none, publish what settlement left unpublished."""
from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import msgspec
import pytest

from infra.config.settings import Settings
from schemas import GenerationFinished, Usage, UsageRecorded
from streams import reaper as reaper_module
from streams.reaper import Reaper
from tests.fake_stores import FakeProducer, FakeQuota, settled_marker


def finished(gid: str) -> GenerationFinished:
    return GenerationFinished(generation_id=gid, conversation_id="c", user_id="u", plan="free", message_id=gid,
                              status="complete", text="hi", usage=Usage(prompt_tokens=33, completion_tokens=4),
                              model="Smol", pool="large", worker_id="w")


@pytest.fixture
def replies(monkeypatch: pytest.MonkeyPatch) -> list[GenerationFinished]:
    log: list[GenerationFinished] = []

    async def replay(bootstrap: str, topic: str, since_s: float, types: Any) -> AsyncIterator[GenerationFinished]:
        assert topic == "t.chat.replies"
        for event in log:
            yield event

    monkeypatch.setattr(reaper_module, "replay", replay)
    return log


async def reaper(quota: FakeQuota) -> tuple[Reaper, FakeProducer]:
    r = Reaper(Settings().with_(topic_prefix="t."), quota, outbox_grace_s=0)  # type: ignore[arg-type]
    r.producer = FakeProducer()  # type: ignore[assignment]
    return r, r.producer  # type: ignore[return-value]


async def test_an_expired_reservation_with_a_reply_is_settled_from_the_reply(replies: list[Any]) -> None:
    quota = FakeQuota()
    quota.reserve("g1", created_at=100.0)
    replies.extend([finished("other"), finished("g1")])
    r, producer = await reaper(quota)
    done = await r.sweep(now=1_000.0)
    assert [m.generation_id for m in done] == ["g1"]
    assert quota.settle_calls == [("g1", 33, 4, "complete")]
    [(topic, record, key)] = producer.sent
    assert topic == "t.usage" and isinstance(record, UsageRecorded) and key == "u" and record.tokens_out == 4
    assert quota.markers["g1"].published


async def test_a_reply_that_never_finished_is_released_charging_nothing(replies: list[Any]) -> None:
    quota = FakeQuota()
    quota.reserve("g1", prompt_tokens=40)
    r, producer = await reaper(quota)
    assert await r.sweep(now=1_000.0) == []
    assert quota.settle_calls == [] and quota.release_calls == [("g1", "expired")]  # never the prompt estimate
    assert quota.markers["g1"].charged == 0 and producer.sent == []  # nothing charged, nothing to record


async def test_a_failed_reply_in_the_log_is_settled_with_what_the_engine_did(replies: list[Any]) -> None:
    quota = FakeQuota()
    quota.reserve("g1")
    quota.reserve("g2")
    replies.append(msgspec.structs.replace(finished("g1"), status="failed"))  # failed in the engine
    replies.append(msgspec.structs.replace(finished("g2"), status="failed", usage=Usage()))  # before any engine
    r, _ = await reaper(quota)
    await r.sweep(now=1_000.0)
    assert sorted(quota.settle_calls) == [("g1", 33, 4, "failed"), ("g2", 0, 0, "failed")]


async def test_nothing_expired_replays_nothing_and_stale_ids_are_forgotten(replies: list[Any]) -> None:
    quota = FakeQuota(stale={"gone"})
    quota.reserve("fresh", created_at=900.0)  # expires at 1,200
    r, producer = await reaper(quota)
    assert await r.sweep(now=1_000.0) == []
    assert quota.forgotten == ["gone"] and quota.settle_calls == [] and producer.sent == []


async def test_settled_but_unpublished_usage_is_published(replies: list[Any]) -> None:
    quota = FakeQuota(markers={"g9": settled_marker("g9")})
    r, producer = await reaper(quota)
    assert [m.generation_id for m in await r.sweep(now=1_000.0)] == ["g9"]
    assert [e.generation_id for _, e, _ in producer.sent] == ["g9"]  # type: ignore[attr-defined]
    assert quota.markers["g9"].published
