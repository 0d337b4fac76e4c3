"""The gateway's guard: a body over the limit is a 413 unread, and a caller out of refusals is a 429 before
its request reaches a route, while other callers and requests with no credentials go on."""
from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import pytest
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from fastapi.testclient import TestClient
from starlette.types import Message, Receive, Scope, Send

from infra.config.settings import Settings
from producers.gateway.guard import HOLD_PER_CALLER, Guard, RefusalBudget, caller_of


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_bucket_empties_on_refusals_and_refills_at_its_rate() -> None:
    clock = Clock()
    budget = RefusalBudget(burst=3, per_minute=60, clock=clock)  # one back per second
    for _ in range(3):
        assert budget.wait_s(b"a") == 0
        budget.refused(b"a")
    assert budget.wait_s(b"a") == pytest.approx(1.0) and budget.wait_s(b"b") == 0
    clock.now += 0.5
    assert budget.wait_s(b"a") == pytest.approx(0.5)
    clock.now += 0.5
    assert budget.wait_s(b"a") == 0
    clock.now += 3600
    budget.refused(b"a")  # refilled to the burst, never past it
    assert budget._level(b"a", clock.now) == pytest.approx(2.0)
    assert not RefusalBudget(0, 60).enabled and not RefusalBudget(5, 0).enabled


def test_the_caller_is_the_token_else_the_session_cookie_and_the_length_is_read() -> None:
    assert caller_of([(b"authorization", b"Bearer x"), (b"content-length", b"12")]) == (b"Bearer x", 12)
    assert caller_of([(b"cookie", b"theme=dark; parley_session=s1")]) == (b"parley_session=s1", None)
    assert caller_of([(b"cookie", b"theme=dark"), (b"content-length", b"x")]) == (None, None)


@pytest.fixture
def app() -> Iterator[tuple[TestClient, dict[str, int]]]:
    calls = {"n": 0}
    inner = FastAPI()

    @inner.post("/bad")
    @inner.post("/v1/chat/completions")
    async def bad(request: Request) -> JSONResponse:
        calls["n"] += 1
        await request.body()
        return JSONResponse({"error": {"code": "bad"}}, status_code=400)

    @inner.post("/ok")
    async def ok(request: Request) -> dict[str, int]:
        calls["n"] += 1
        return {"bytes": len(await request.body())}

    settings = Settings().with_(refusal_burst=3, refusals_per_minute=6, max_body_bytes=1000, refusal_hold_s=0.05)
    inner.add_middleware(Guard, settings=settings)
    with TestClient(inner) as client:
        yield client, calls


def test_a_caller_out_of_refusals_gets_429_before_the_route_and_others_go_on(
        app: tuple[TestClient, dict[str, int]]) -> None:
    client, calls = app
    mallory, alice = {"Authorization": "Bearer m"}, {"Authorization": "Bearer a"}
    assert [client.post("/bad", headers=mallory, content=b"{}").status_code for _ in range(3)] == [400] * 3
    before = calls["n"]
    r = client.post("/bad", headers=mallory, content=b"{}")
    assert r.status_code == 429 and r.json()["error"]["code"] == "too_many_refused"
    assert 1 <= int(r.headers["retry-after"]) <= 10 and calls["n"] == before  # the route never ran
    r = client.post("/v1/chat/completions", headers=mallory, content=b"{}")  # OpenAI's shape on its paths
    assert r.status_code == 429 and r.json()["error"]["code"] == "rate_limit_exceeded"
    assert client.post("/ok", headers=mallory).status_code == 429  # even a good request waits its turn
    assert client.post("/ok", headers=alice).status_code == 200  # another caller is not touched
    assert client.post("/bad", headers=alice).status_code == 400
    # no credentials: never budgeted here
    assert [client.post("/bad").status_code for _ in range(6)] == [400] * 6


async def test_a_caller_out_of_refusals_is_held_then_heard_or_refused_and_only_so_many_are_held() -> None:
    clock = Clock()
    calls: list[str] = []

    async def route(scope: Scope, receive: Receive, send: Send) -> None:
        calls.append(scope["path"])
        await send({"type": "http.response.start", "status": 200 if scope["path"] == "/ok" else 400, "headers": []})
        await send({"type": "http.response.body", "body": b"{}"})

    guard = Guard(route, Settings().with_(refusal_burst=1, refusals_per_minute=60, refusal_hold_s=0.2))
    guard.budget.clock = clock
    sent: list[int] = []

    async def send(message: Message) -> None:
        if message["type"] == "http.response.start":
            sent.append(message["status"])

    async def receive() -> Message:
        return {"type": "http.request", "body": b"", "more_body": False}

    def request(path: str) -> Scope:
        return {"type": "http", "method": "GET", "path": path, "headers": [(b"authorization", b"Bearer m")]}

    await guard(request("/a"), receive, send)  # refused: the bucket is empty now, one back in 1 s
    assert sent == [400]
    started = time.monotonic()
    await guard(request("/b"), receive, send)  # held 0.2 s (a second's wait, capped), then still out: 429
    assert sent == [400, 429] and time.monotonic() - started >= 0.19 and calls == ["/a"]

    async def refill() -> None:
        await asyncio.sleep(0.05)
        clock.now += 1.0  # the refusal comes back while the request is held
    await asyncio.gather(guard(request("/c"), receive, send), refill())
    assert sent == [400, 429, 400] and calls == ["/a", "/c"]  # held, then heard

    # Of several held, one is heard per refusal that comes back; the others are answered 429
    sent.clear()
    calls.clear()
    tasks = [asyncio.create_task(guard(request("/e"), receive, send)) for _ in range(5)]
    await asyncio.sleep(0.05)
    clock.now += 1.0  # one refusal back
    await asyncio.gather(*tasks)
    assert calls == ["/e"] and sorted(sent) == [400, 429, 429, 429, 429]

    # A held request heard and not refused gives back the refusal it took: the next is heard without a hold
    sent.clear()
    await asyncio.gather(guard(request("/ok"), receive, send), refill())
    assert sent == [200] and guard.budget.wait_s(b"Bearer m") == 0

    await guard(request("/f"), receive, send)  # spends it
    # Past HOLD_PER_CALLER held at once, the caller's next requests are answered at once
    sent.clear()
    tasks = [asyncio.create_task(guard(request("/d"), receive, send)) for _ in range(HOLD_PER_CALLER + 4)]
    await asyncio.sleep(0.05)
    assert guard.holding == HOLD_PER_CALLER and sent == [429] * 4  # the 4 past the cap answered, not held
    await asyncio.gather(*tasks)
    assert sent == [429] * (HOLD_PER_CALLER + 4) and guard.holding == 0 and not guard.held


def test_successes_spend_nothing(app: tuple[TestClient, dict[str, int]]) -> None:
    client, _ = app
    for _ in range(20):
        assert client.post("/ok", headers={"Authorization": "Bearer a"}, content=b"x").status_code == 200


def test_a_body_over_the_limit_is_413_unread_whether_its_length_is_declared_or_chunked(
        app: tuple[TestClient, dict[str, int]]) -> None:
    client, calls = app
    r = client.post("/ok", content=b"x" * 1001)
    assert r.status_code == 413 and r.json()["error"]["code"] == "request_too_large"
    assert "1,001 bytes" in r.json()["error"]["message"] and calls["n"] == 0

    def chunks(n: int) -> Iterator[bytes]:
        for _ in range(n):
            yield b"y" * 100

    r = client.post("/ok", content=chunks(11))  # no Content-Length: counted as read
    assert r.status_code == 413 and calls["n"] == 0
    r = client.post("/ok", content=chunks(10))  # at the limit: the route reads it whole
    assert r.status_code == 200 and r.json() == {"bytes": 1000}
    assert client.post("/ok", content=b"z" * 1000).json() == {"bytes": 1000}
