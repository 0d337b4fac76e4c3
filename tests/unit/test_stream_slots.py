"""Open streams per user: a cap, a 429 with Retry-After past it, and the slot back however a stream ends."""
from __future__ import annotations

import asyncio
import gc

import pytest
from starlette.responses import JSONResponse, StreamingResponse

from producers.gateway.errors import ApiError
from producers.gateway.stream_slots import StreamSlots


def test_past_the_cap_is_a_429_with_retry_after_and_other_users_are_unaffected() -> None:
    slots = StreamSlots(2)
    first, _ = slots.take("ann"), slots.take("ann")
    with pytest.raises(ApiError) as caught:
        slots.take("ann")
    err = caught.value
    assert err.status == 429 and err.code == "too_many_streams" and "limit is 2" in err.message
    assert err.headers()["Retry-After"] == "5" and err.body()["error"]["retry_after_s"] == 5.0
    slots.take("bob")
    first.release()
    first.release()  # twice gives back one slot only
    slots.take("ann")
    assert slots.open == {"ann": 2, "bob": 1}


def test_past_the_gateways_cap_is_a_503_with_retry_after_for_anyone() -> None:
    slots = StreamSlots(2, gateway_cap=3)
    held = [slots.take("ann"), slots.take("ann"), slots.take("bob")]
    with pytest.raises(ApiError) as caught:
        slots.take("cat")  # under her own cap, over the gateway's
    err = caught.value
    assert err.status == 503 and err.code == "server_full" and err.headers()["Retry-After"] == "5"
    with pytest.raises(ApiError) as caught:
        slots.take("ann")  # her own cap first: that one she can do something about
    assert caught.value.status == 429
    held[0].release()
    slots.take("cat")
    assert slots.total == 3 and slots.open == {"ann": 1, "bob": 1, "cat": 1}
    assert StreamSlots(1).gateway_cap == 0  # no gateway cap unless configured


async def _send_through(response: object, fail: bool = False) -> None:
    async def receive() -> dict[str, object]:
        await asyncio.sleep(10)
        return {"type": "http.disconnect"}

    async def send(message: dict[str, object]) -> None:
        if fail and message["type"] == "http.response.body":
            raise OSError("client gone")

    await response({"type": "http", "method": "GET", "path": "/", "headers": [],  # type: ignore[operator]
                    "asgi": {"spec_version": "2.3"}}, receive, send)


async def test_a_held_response_gives_its_slot_back_when_sent_failed_or_never_sent() -> None:
    slots = StreamSlots(1)

    async def body() -> object:
        yield b"data: x\n\n"

    await _send_through(slots.take("ann").holding(StreamingResponse(body())))
    assert slots.open == {}
    with pytest.raises(OSError):
        await _send_through(slots.take("ann").holding(JSONResponse({"a": 1})), fail=True)
    assert slots.open == {}
    slots.take("ann").holding(JSONResponse({"a": 1}))  # dropped without being sent
    gc.collect()
    assert slots.open == {}
