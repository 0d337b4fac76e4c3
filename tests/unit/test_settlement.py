"""Settlement's logic with a fake quota: charge once, publish once, wait out Redis, skip what is not a reply."""
from __future__ import annotations

from prometheus_client import REGISTRY

from consumers.settlement import Settlement
from infra.stores import keys
from infra.stores.retry import HEALTH, until_stored
from schemas import GenerationFinished, Usage, UsageRecorded
from tests.fake_stores import FakeQuota, settled_marker


def finished(gid: str = "g1", purpose: str = "reply", status: str = "complete") -> GenerationFinished:
    return GenerationFinished(generation_id=gid, conversation_id="c", user_id="u", plan="free", message_id="m",
                              status=status, text="hi", usage=Usage(prompt_tokens=30, completion_tokens=7),
                              model="Smol", pool="large", worker_id="w", purpose=purpose)  # type: ignore[arg-type]


def settlement(quota: FakeQuota) -> tuple[Settlement, list[UsageRecorded]]:
    sent: list[UsageRecorded] = []

    async def send(record: UsageRecorded) -> None:
        sent.append(record)

    return Settlement(quota, send), sent  # type: ignore[arg-type]


async def test_a_reply_is_charged_its_real_tokens_and_published_once() -> None:
    quota = FakeQuota()
    quota.reserve("g1")
    s, sent = settlement(quota)
    marker = await s.handle(finished())
    assert marker is not None and (marker.tokens_in, marker.tokens_out, marker.charged) == (30, 7, 37)
    assert [r.generation_id for r in sent] == ["g1"] and sent[0].tokens_in == 30
    assert quota.markers["g1"].published
    assert await s.handle(finished()) is None  # a redelivery: settled and published already
    assert len(sent) == 1


async def test_a_redelivery_publishes_what_a_crashed_attempt_settled_but_never_sent() -> None:
    quota = FakeQuota(markers={"g1": settled_marker("g1", published=False)})
    s, sent = settlement(quota)
    assert await s.handle(finished()) is not None
    assert [r.generation_id for r in sent] == ["g1"] and quota.markers["g1"].published


async def test_titles_and_unknown_generations_are_not_charged() -> None:
    quota = FakeQuota()
    s, sent = settlement(quota)
    assert await s.handle(finished("g1:title", purpose="title")) is None
    assert quota.settle_calls == []
    assert await s.handle(finished("never-reserved")) is None  # no reservation, no marker: nothing to send
    assert sent == []


async def test_redis_unreachable_is_waited_out_not_skipped() -> None:
    """As the agent runs it (``streams.app.applied``): under the one retry policy, its waits in health and
    metrics."""
    quota = FakeQuota(failures_left=2)
    quota.reserve("g1")
    s, sent = settlement(quota)
    def waits() -> float:
        return REGISTRY.get_sample_value("parley_stage_store_waits_total",
                                         {"stage": "settlement", "dependency": "Redis"}) or 0.0

    before, seen = waits(), []
    HEALTH.listeners.append(seen.append)
    try:
        assert await until_stored("settlement", s.handle, finished(status="stopped"), first_s=0.001) is not None
    finally:
        HEALTH.listeners.remove(seen.append)
    assert quota.settle_calls == [("g1", 30, 7, "stopped")] and len(sent) == 1
    assert waits() - before == 2
    assert [sorted(w) for w in seen] == [["settlement"], []]  # waiting for Redis, then healthy again


async def test_a_fenced_off_workers_late_finish_is_not_settled_and_the_new_owners_is() -> None:
    import msgspec

    quota = FakeQuota()
    await quota.redis.set(keys.generation_epoch("g1"), 2)
    quota.reserve("g1")
    s, sent = settlement(quota)
    assert await s.handle(msgspec.structs.replace(finished(), epoch=1)) is None  # epoch 2 took it over
    assert quota.settle_calls == [] and sent == []
    marker = await s.handle(msgspec.structs.replace(finished(), epoch=2))
    assert marker is not None and len(sent) == 1
    assert await s.handle(finished()) is None  # epoch 0 (no owner's) is never fenced: a redelivery, settled once
