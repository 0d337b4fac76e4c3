"""Redis becomes unreachable while a reply streams, on real Kafka and Redis (cut at the network by a proxy):
the worker pauses the reply in place instead of dropping it, and once Redis is back it resumes the reply from
its saved tokens, so the reply ends once, complete, its tokens numbered without a gap or a repeat. Before, the
reply's end failed on Redis, the worker logged it and committed the request: the client waited for good and its
reservation stayed held. The engine is the test double (tests/fakes.py): what is under test is the worker."""
from __future__ import annotations

import time
from typing import Any

from consumers.generation.decisions import Limits
from consumers.generation.worker import GenerationWorker
from infra.config.plans import Plan
from infra.config.settings import Settings
from schemas import GenerationFinished, TokensAppended
from tests.e2e.proxy import DroppingProxy
from tests.fakes import FakeEngine
from tests.integration.worker_requests import one_reply, streamed

PLANS = {"paid": Plan("paid", 500_000, 40_000, 80_000, 2, 64, 30, "paid")}
REPLY = " ".join(f"w{i}" for i in range(60))
OUTAGE_S = 4.0


async def test_a_reply_waits_out_a_redis_outage_and_ends_once_complete(settings: Settings) -> None:
    async with DroppingProxy(settings.ports.redis) as redis_proxy:
        through_proxy = settings.with_(redis_server=f"redis://127.0.0.1:{redis_proxy.port}/0")
        worker = GenerationWorker(through_proxy, Limits("large", "fake", max_model_len=512),
                                  FakeEngine(reply=REPLY, step_delay=0.05), capacity=4, worker_id="outage",
                                  plans=PLANS)  # type: ignore[arg-type]
        cut_at = 0.0

        def during(events: list[Any], start: object) -> None:
            nonlocal cut_at
            if not cut_at and streamed(events) >= 5:
                redis_proxy.cut()  # mid-reply: the worker next needs Redis at the reply's end
                cut_at = time.monotonic()
            if cut_at and redis_proxy.refusing and time.monotonic() - cut_at > OUTAGE_S:
                redis_proxy.restore()

        events = await one_reply(settings, worker, 40, during, before_stop=redis_proxy.restore)

    assert cut_at, "the reply never streamed"
    ends = [e for e in events if isinstance(e, GenerationFinished)]
    assert len(ends) == 1, [type(e).__name__ for e in events]
    assert ends[0].status == "length", ends[0]  # all 40 tokens (the reply is longer), not failed
    assert worker.metrics.store_waits._value.get() >= 1  # it did wait for Redis
    seqs = [e.seq for e in events if isinstance(e, TokensAppended)]
    assert seqs == list(range(len(seqs))), seqs  # numbered from 0, no gap, no repeat across the pause
    text = "".join(e.text for e in events if isinstance(e, TokensAppended))
    assert text == ends[0].text and text.split() == [f"w{i}" for i in range(40)]
    assert ends[0].usage.completion_tokens == 40
