"""The simulated engine behind a real worker on real Kafka and Redis, with the pool's real tokenizer: the
reply streams at the GPU step rate, its counts are the tokenizer's, and a second reply of the conversation is
served from the prefix cache. What is under test is the sim pool as the product runs it (``engine = "sim"``)."""
from __future__ import annotations

from typing import Any

from consumers.generation.decisions import Limits
from consumers.generation.sim_engine import SimEngine
from consumers.generation.worker import GenerationWorker
from infra.config.pools import SimConfig
from infra.config.settings import Settings
from infra.local.model import ready_pool
from schemas import GenerationFinished, TokensAppended
from tests.integration.worker_requests import PLANS, one_reply


async def test_a_sim_pool_streams_a_reply_counted_by_the_real_tokenizer(settings: Settings,
                                                                       redis_client: Any) -> None:
    pool = ready_pool("large", settings)
    pool = type(pool)(**{**{f: getattr(pool, f) for f in pool.__struct_fields__},
                         "engine": "sim", "sim": SimConfig(reply_tokens=40)})
    engine = SimEngine.for_pool(pool)
    worker = GenerationWorker(settings, Limits("large", pool.served_model_name, pool.max_model_len), engine,
                              capacity=4, worker_id="sim", plans=PLANS)  # type: ignore[arg-type]
    events = await one_reply(settings, worker, 200, lambda *_: None)

    appended = [e for e in events if isinstance(e, TokensAppended)]
    ends = [e for e in events if isinstance(e, GenerationFinished)]
    assert len(ends) == 1 and ends[0].status == "complete", [type(e).__name__ for e in events]
    ids = [t for e in appended for t in e.token_ids]
    assert 20 <= len(ids) <= 60 and ends[0].usage.completion_tokens == len(ids)
    text = "".join(e.text for e in appended)
    assert text == engine.tokenizer.decode(ids)  # the pool's own vocabulary: deltas join to the decoded reply
    assert len(engine.tokenizer.encode(text, add_special_tokens=False)) == len(ids)
    stats = engine.sim_stats()
    assert stats["tokens"] == len(ids) and stats["steps"] >= len(ids)
    # one step per token at ~17.5 ms of modelled time each: the replica's pace, not the CPU's
    assert 0.017 * len(ids) < stats["virtual_seconds"] < 0.025 * len(ids)
