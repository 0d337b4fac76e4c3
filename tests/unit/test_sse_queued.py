import time

import orjson

from producers.gateway.sse import to_sse
from schemas import GenerationQueued

IDS = {"generation_id": "g", "conversation_id": "c", "user_id": "u", "message_id": "m"}


def _events(frames: list[bytes]) -> list[tuple[str, dict[str, object]]]:
    out = []
    for f in frames:
        lines = dict(line.split(": ", 1) for line in f.decode().strip().split("\n"))
        out.append((lines["event"], orjson.loads(lines["data"])))
    return out


def test_the_decision_starts_the_message_and_tells_the_wait() -> None:
    queued = GenerationQueued(**IDS, pool="large", model="L", lane="free", position=4, estimated_wait_s=30.0)
    (start, _), (name, data) = _events(to_sse(5, queued))
    assert (start, name, data["position"]) == ("message_start", "queued", 4)
    assert 29.5 <= data["estimated_wait_s"] <= 30.0  # type: ignore[operator]


def test_a_revision_is_a_queued_event_alone_with_the_wait_left_when_it_is_read() -> None:
    revised = GenerationQueued(**IDS, pool="large", model="L", lane="free", position=2, estimated_wait_s=30.0,
                               revision=1, at=time.time() - 12)  # read 12 s after it was written (a replay)
    [(name, data)] = _events(to_sse(9, revised))
    assert name == "queued" and data["position"] == 2 and 17.5 <= data["estimated_wait_s"] <= 18.0  # type: ignore[operator]
    late = GenerationQueued(**IDS, pool="large", model="L", lane="free", position=2, estimated_wait_s=3.0,
                            at=time.time() - 60)
    assert _events(to_sse(9, late))[1][1]["estimated_wait_s"] == 0.0


def test_no_wait_no_queued_event() -> None:
    now = GenerationQueued(**IDS, pool="large", model="L", lane="paid", position=0, estimated_wait_s=0.0)
    assert [name for name, _ in _events(to_sse(1, now))] == ["message_start"]
