"""The worker's Kafka producer stops getting acks mid-reply (as when every broker restarted with batches in
flight and the brokers hold an older sequence than the idempotent producer: aiokafka then retries those
appends for good). On real Kafka and Redis: the worker gives up waiting after its ack timeout, renews its
producer and serves the reply again from its saved tokens, so the reply ends once with its tokens numbered
without a gap or a repeat. The stuck producer is a wrapper that swallows sends; the engine is the test double."""
from __future__ import annotations

import asyncio
from typing import Any

import pytest

from infra.config.settings import Settings
from schemas import GenerationFinished, TokensAppended
from tests.integration.worker_requests import one_reply, quick_renewing_worker, streamed


class StuckProducer:
    """Takes sends and never gets them acknowledged."""

    def __init__(self, real: Any) -> None:
        self.real, self.swallowed = real, 0

    async def send(self, *args: Any, **kwargs: Any) -> asyncio.Future[Any]:
        self.swallowed += 1
        return asyncio.get_running_loop().create_future()

    async def send_and_wait(self, *args: Any, **kwargs: Any) -> Any:
        return await (await self.send(*args, **kwargs))

    async def flush(self) -> None:
        await asyncio.Event().wait()

    async def stop(self) -> None:
        await self.real.stop()


async def test_a_reply_whose_producer_gets_no_acks_is_served_again_through_a_new_one(
        settings: Settings, monkeypatch: pytest.MonkeyPatch) -> None:
    worker = quick_renewing_worker(settings, monkeypatch, "stuck", ack_timeout_s=2.0)
    stuck: StuckProducer | None = None

    def during(events: list[Any], start: object) -> None:
        nonlocal stuck
        if stuck is None and streamed(events) >= 5:
            stuck = worker.producer = StuckProducer(worker.producer)  # type: ignore[assignment]

    events = await one_reply(settings, worker, 40, during)

    assert stuck is not None and stuck.swallowed > 0, "the producer was never stuck"
    assert worker.producer is not stuck  # renewed
    ends = [e for e in events if isinstance(e, GenerationFinished)]
    assert len(ends) == 1, [type(e).__name__ for e in events]
    assert ends[0].status == "length" and ends[0].usage.completion_tokens == 40, ends[0]
    seqs = [e.seq for e in events if isinstance(e, TokensAppended)]
    assert seqs == list(range(len(seqs))), seqs  # the swallowed appends were made again, once
    # What the clients were shown is what the reply says (the fake engine starts its words again on a resume).
    assert "".join(e.text for e in events if isinstance(e, TokensAppended)) == ends[0].text
    assert sum(len(e.token_ids) for e in events if isinstance(e, TokensAppended)) == 40
