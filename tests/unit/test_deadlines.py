"""Work past its deadline (its client was already answered 503) is dropped: nothing reserved, generated or
charged; a reservation already made is released at 0."""
from __future__ import annotations

import time
from typing import Any

import msgspec

from consumers.admission import Admission, AdmissionRules
from consumers.deadlines import late, mark_queued, past_deadline
from consumers.prompt.builder import PromptBuilder
from infra.config.plans import load_plans
from schemas import GenerationFinished, RequestAdmitted
from tests.fake_stores import FakeRedis
from tests.unit.test_admission import submitted
from tests.unit.test_scheduler import _prompt, _scheduler
from topics import Topics


class RecordingQuota:
    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []

    async def reserve(self, *args: Any, **kwargs: Any) -> Any:
        self.calls.append(("reserve", args))
        raise AssertionError("reserved a request past its deadline")

    async def settle(self, generation_id: str, tokens_in: int, tokens_out: int, **kwargs: Any) -> None:
        self.calls.append(("settle", (generation_id, tokens_in, tokens_out, kwargs.get("status"))))


def test_past_deadline() -> None:
    assert past_deadline(10.0, now=10.5) and not past_deadline(10.0, now=9.9) and not past_deadline(0.0, now=1e12)


async def test_admission_drops_a_late_request_without_reserving() -> None:
    quota = RecordingQuota()
    admission = Admission(quota, load_plans(), AdmissionRules(), Topics())  # type: ignore[arg-type]
    assert await admission.handle(submitted(deadline=time.time() - 1)) == [] and quota.calls == []


async def test_prompt_build_drops_a_late_request_and_releases_its_reservation_at_zero() -> None:
    quota = RecordingQuota()
    builder = PromptBuilder(None, None, Topics(), lambda pool: None, 6000, lambda pool: 2048, quota=quota)  # type: ignore[arg-type]
    late = RequestAdmitted(generation_id="g", conversation_id="c", user_id="u", plan="free", message_id="m",
                           client_message_id="k", content="hi", pool="large", reply_cap=64, reserved_tokens=80,
                           deadline=time.time() - 1)
    assert await builder.handle(late) == []  # no Cassandra touched: the stores here are None
    assert quota.calls == [("settle", ("g", 0, 0, "failed"))]


async def test_the_scheduler_never_queues_a_late_request_and_ends_it_failed_at_zero() -> None:
    scheduler = _scheduler(busy=False)
    outs = await scheduler.handle(msgspec.structs.replace(_prompt(), deadline=time.time() - 1))
    assert {o.topic for o in outs} == {"t.chat.tokens", "t.chat.replies"}
    done = outs[0].event
    assert isinstance(done, GenerationFinished) and done.status == "failed" and done.usage.completion_tokens == 0
    assert done.usage.prompt_tokens == 0 and done.reserved_tokens == 12 and "nothing was charged" in done.reason
    assert scheduler.queues.pools["large"].running == {} and scheduler.queues.pools["large"].waiting["free"] == {}
    on_time = await scheduler.handle(msgspec.structs.replace(_prompt(), deadline=time.time() + 60))
    assert on_time[1].topic == "t.generate.large.free"


async def test_a_redelivery_after_a_restart_of_a_queued_generation_is_not_late_work() -> None:
    # The stages process died after the scheduler queued the reply and before its offset was committed; the
    # restart hands it the same record, now past its deadline. The reply is streaming (or done): it must be
    # queued again as any redelivery is, not ended as failed with its charge released.
    redis = FakeRedis()
    scheduler = _scheduler(busy=False)
    scheduler.redis = redis
    first = await scheduler.handle(msgspec.structs.replace(_prompt(), deadline=time.time() + 60))
    assert first[1].topic == "t.generate.large.free"
    restarted = _scheduler(busy=False)  # a new process: its queues start empty, the marks are in Redis
    restarted.redis = redis
    again = await restarted.handle(msgspec.structs.replace(_prompt(), deadline=time.time() - 30))
    assert [o.topic for o in again] == ["t.chat.tokens", "t.generate.large.free"]
    assert not any(isinstance(o.event, GenerationFinished) for o in again)
    # The prompt stage's redelivery is not late either; one never queued still is, and with no Redis every
    # late record is dropped as before.
    assert not await late(time.time() - 30, "g", redis)
    assert await late(time.time() - 30, "other", redis) and await late(time.time() - 30, "g", None)
    assert not await late(time.time() + 30, "other", redis)
    await mark_queued(None, "g")  # no Redis: nothing to mark, no error
