"""A reply moved to another pool (overflow) or to a prepared reply (canned) is announced on its stream's
``message_start``, the moment the scheduler decides, with the pool that was asked for."""
from __future__ import annotations

import orjson

from consumers.scheduler.canned import CANNED_POOL
from producers.gateway.sse import to_sse
from schemas import GenerationQueued, PoolPrompt
from tests.unit.test_scheduler import _prompt, _scheduler


def start_of(queued: GenerationQueued) -> dict[str, object]:
    head, data = to_sse(3, queued)[0].decode().split("data: ", 1)
    assert "event: message_start" in head
    return dict(orjson.loads(data))


async def test_an_overflowed_reply_starts_by_naming_both_pools() -> None:
    fitted = PoolPrompt(pool="small", max_tokens=7, prompt_token_ids=[9, 9, 9])
    outs = await _scheduler(busy=True, busy_pools=("large",)).handle(_prompt("story", alternates=[fitted]))
    queued = outs[0].event
    assert isinstance(queued, GenerationQueued)
    assert (queued.pool, queued.route_reason, queued.requested_pool) == ("small", "overflow", "large")
    start = start_of(queued)
    assert (start["pool"], start["model"], start["route_reason"], start["requested_pool"]) == (
        "small", "S", "overflow", "large")


async def test_a_prepared_reply_starts_as_canned() -> None:
    outs = await _scheduler(busy=True).handle(_prompt("Hello!"))
    queued = outs[0].event
    assert isinstance(queued, GenerationQueued) and queued.pool == CANNED_POOL
    start = start_of(queued)
    assert (start["route_reason"], start["requested_pool"]) == ("canned", "large")


async def test_a_reply_on_its_own_pool_is_no_fallback() -> None:
    outs = await _scheduler(busy=False).handle(_prompt(pool="small"))
    start = start_of(outs[0].event)  # type: ignore[arg-type]
    assert (start["pool"], start["requested_pool"]) == ("small", "small")
    assert start["route_reason"] not in ("overflow", "canned")


def test_an_event_from_before_the_field_names_its_own_pool_as_asked_for() -> None:
    old = GenerationQueued(generation_id="g", conversation_id="c", user_id="u", pool="large", model="L",
                           lane="free", position=0, estimated_wait_s=0.0)
    start = start_of(old)
    assert (start["route_reason"], start["requested_pool"]) == ("default", "large")
