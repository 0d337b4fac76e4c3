"""Every broker is down for a while mid-reply, then back (as in the fault suite's 20 s Kafka stop). The
idempotent producer holds the appends it could not send and retries them until they land, so they reach the
log after the outage; the worker, told nothing within its ack timeout, serves the reply again. On real Kafka
and Redis: the retry reads the saved tokens only once those held appends have landed, so the reply's tokens
are numbered once each, and what the readers were shown is the reply's text. (Resuming before them wrote a
second set of tokens at the same seqs behind the first, and clients shown the first kept text the saved
reply did not have.) The outage is a wrapper that holds sends in order; the engine is the test double."""
from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from aiokafka.errors import KafkaConnectionError

from consumers.generation import appending
from infra.config.settings import Settings
from schemas import GenerationFinished, TokensAppended
from tests.integration.worker_requests import one_reply, quick_renewing_worker, streamed

OUTAGE_S = 6.0


class HeldProducer:
    """The real producer behind an outage: sends are queued in order and handed on only once it is over."""

    def __init__(self, real: Any, outage_s: float) -> None:
        self.real, self.until = real, time.monotonic() + outage_s
        self.queue: asyncio.Queue[tuple[tuple[Any, ...], dict[str, Any], asyncio.Future[Any]]] = asyncio.Queue()
        self.held = 0
        self.drain = asyncio.create_task(self._drain())

    def down(self) -> bool:
        return time.monotonic() < self.until

    async def _drain(self) -> None:
        while True:
            args, kwargs, future = await self.queue.get()
            await asyncio.sleep(max(0.0, self.until - time.monotonic()))
            sent = await (await self.real.send(*args, **kwargs))
            if not future.done():
                future.set_result(sent)

    async def send(self, *args: Any, **kwargs: Any) -> asyncio.Future[Any]:
        self.held += self.down()
        future = asyncio.get_running_loop().create_future()
        await self.queue.put((args, kwargs, future))
        return future

    async def send_and_wait(self, *args: Any, **kwargs: Any) -> Any:
        return await (await self.send(*args, **kwargs))

    async def flush(self) -> None:
        while not self.queue.empty():
            await asyncio.sleep(0.05)

    async def stop(self) -> None:  # as aiokafka's: what it holds is sent first
        await self.flush()
        self.drain.cancel()
        await self.real.stop()


async def test_a_retry_after_an_outage_waits_for_the_held_appends_and_numbers_each_token_once(
        settings: Settings, monkeypatch: pytest.MonkeyPatch) -> None:
    worker = quick_renewing_worker(settings, monkeypatch, "held", ack_timeout_s=1.0)
    held: HeldProducer | None = None
    real_make = appending.make_producer

    def make_producer(bootstrap: str, **kwargs: Any) -> Any:  # no new producer starts while every broker is down
        fresh = real_make(bootstrap, **kwargs)
        if held is not None and held.down():
            async def refused() -> None:
                raise KafkaConnectionError("every broker is down")
            fresh.start = refused  # type: ignore[method-assign]
        return fresh

    monkeypatch.setattr(appending, "make_producer", make_producer)

    def during(events: list[Any], start: object) -> None:
        nonlocal held
        if held is None and streamed(events) >= 5:
            held = worker.producer = HeldProducer(worker.producer, OUTAGE_S)  # type: ignore[assignment]

    events = await one_reply(settings, worker, 40, during, settle_s=2.0)

    assert held is not None and held.held > 0, "no append was held by the outage"
    ends = [e for e in events if isinstance(e, GenerationFinished)]
    assert len(ends) == 1, [type(e).__name__ for e in events]
    seqs = [e.seq for e in events if isinstance(e, TokensAppended)]
    assert seqs == list(range(len(seqs))), seqs  # no seq written twice, none skipped
    assert "".join(e.text for e in events if isinstance(e, TokensAppended)) == ends[0].text
    assert ends[0].usage.completion_tokens == 40 == sum(len(e.token_ids) for e in events
                                                        if isinstance(e, TokensAppended))
