"""A second worker joins the pool while a reply streams, on real Kafka and Redis: the rebalance hands the
reply to one owner at a time. The first worker lets go of it before the partitions move (no older-epoch token
after the new owner's first event), the new owner resumes it from its saved tokens under a newer epoch, and the
reply ends exactly once with its tokens numbered without a gap or a repeat. The engines are the test double
(tests/fakes.py): what is under test is the workers' hand-over."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

from consumers.generation.decisions import Limits
from consumers.generation.worker import GenerationWorker
from infra.config.plans import Plan
from infra.config.settings import Settings
from schemas import GenerationFinished, GenerationStarted, TokensAppended
from tests.fakes import FakeEngine
from tests.integration.worker_requests import one_reply, streamed

PLANS = {"paid": Plan("paid", 500_000, 40_000, 80_000, 2, 64, 30, "paid")}
REPLY = " ".join(f"w{i}" for i in range(80))


async def test_a_worker_joining_mid_reply_takes_it_over_with_one_owner_at_a_time(settings: Settings,
                                                                                redis_client: Any) -> None:
    limits = Limits("large", "fake", max_model_len=512)
    first = GenerationWorker(settings, limits, FakeEngine(reply=REPLY, step_delay=0.08), capacity=4,
                             worker_id="first", plans=PLANS)  # type: ignore[arg-type]
    second = GenerationWorker(settings, limits, FakeEngine(reply=REPLY, step_delay=0.08), capacity=4,
                              worker_id="second", plans=PLANS)  # type: ignore[arg-type]
    joined = False

    def during(events: list[Any], start: Callable[[GenerationWorker], None]) -> None:
        nonlocal joined
        if not joined and streamed(events) >= 5:
            start(second)  # joins mid-reply: the group rebalances
            joined = True

    events = await one_reply(settings, first, 60, during, settle_s=2)  # 2 s: anything a second owner appends

    ends = [e for e in events if isinstance(e, GenerationFinished)]
    assert len(ends) == 1, [type(e).__name__ for e in events]
    newest = max(e.epoch for e in events if isinstance(e, (GenerationStarted, TokensAppended)))
    assert newest >= 2 and ends[0].epoch == newest  # taken over once, finished by the owner that took it
    takeover = next(i for i, e in enumerate(events) if getattr(e, "epoch", 0) == newest)
    late = [e.seq for e in events[takeover:] if isinstance(e, TokensAppended) and e.epoch < newest]
    assert late == [], f"the old owner appended seqs {late} after the new owner began"
    assert 0 < events[takeover].seq  # resumed after the tokens saved before the hand-over, not from the start
    seqs = [e.seq for e in events if isinstance(e, TokensAppended)]
    assert seqs == list(range(len(seqs))), seqs  # numbered from 0, no gap, no repeat across the hand-over
    assert ends[0].usage.completion_tokens == sum(len(e.token_ids) for e in events if isinstance(e, TokensAppended))
