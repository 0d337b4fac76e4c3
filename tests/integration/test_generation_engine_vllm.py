"""The real vLLM engine on the demo model (eager mode for start-up speed), through ``VllmEngine``.

Loads SmolLM2-135M-Instruct once for the module, converting it from the GGUF first if needed.
"""
from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator

import pytest

from consumers.generation.engine import RequestRejected, StepOutput, VllmEngine
from consumers.generation.sampling import Sampling
from infra.config.settings import Settings
from infra.local.model import ready_pool as load_pool
from tests.fakes import ManualGate
from tests.tools import needs_engine

needs_engine()
pytestmark = pytest.mark.vllm

QUESTION = [{"role": "user", "content": "What is the capital of France? Answer briefly."}]
STORY = [{"role": "user", "content": "Write a long story about a dragon who learns to bake bread."}]
# Longer than two KV blocks (128 tokens each on the CPU): only whole blocks are prefix-cached.
LONG_SYSTEM = "You are Parley's assistant. " + "Answer politely, briefly and accurately. " * 60


@pytest.fixture(scope="module")
async def engine() -> AsyncIterator[VllmEngine]:
    pool = load_pool("small", Settings.from_env())  # the default pool config; converts the model once
    engine = VllmEngine(pool)
    yield engine
    await engine.close()


async def _run(engine: VllmEngine, messages: list[dict[str, str]], max_tokens: int,
               priority: int = 0) -> list[StepOutput]:
    prompt = engine.apply_chat_template(messages)
    async with asyncio.timeout(120):
        return [out async for out in engine.generate(uuid.uuid4().hex, prompt, max_tokens, priority)]


async def test_greedy_answer_names_paris_and_deltas_join_to_the_text(engine: VllmEngine) -> None:
    steps = await _run(engine, QUESTION, 64)
    text = "".join(s.text for s in steps)
    token_ids = [t for s in steps for t in s.token_ids]

    assert "Paris" in text
    assert text == engine.tokenizer.decode(token_ids, skip_special_tokens=True)
    assert steps[-1].finished and steps[-1].finish_reason == "stop"
    assert not any(s.finished for s in steps[:-1])
    assert steps[0].prompt_tokens == len(engine.apply_chat_template(QUESTION))


async def test_abort_mid_stream_ends_it_early(engine: VllmEngine) -> None:
    request_id, max_tokens, steps = uuid.uuid4().hex, 200, []
    async with asyncio.timeout(120):
        async for out in engine.generate(request_id, engine.apply_chat_template(STORY), max_tokens):
            steps.append(out)
            if len(steps) == 3:
                await engine.abort(request_id)

    assert steps[-1].finished and steps[-1].finish_reason == "abort"
    assert sum(len(s.token_ids) for s in steps) < max_tokens


async def test_a_stream_interval_hands_over_tokens_several_at_a_time_with_the_same_reply(engine: VllmEngine) -> None:
    """vLLM's own stream interval, asked per request (``Sampling.stream_interval``): the first token at once, then
    every interval, the last at once; the same greedy tokens, text and logprobs as a token at a time."""
    prompt, outputs = engine.apply_chat_template(STORY), {}
    for interval in (1, 4):
        sampling = Sampling(ignore_eos=True, logprobs=1, stream_interval=interval)
        async with asyncio.timeout(120):
            outputs[interval] = [out async for out in engine.generate(uuid.uuid4().hex, prompt, 22, 0, sampling)]
    one, four = outputs[1], outputs[4]
    # [1, 4, 4, 4, 4, 4, 1] when this test reads as fast as the engine makes them; vLLM joins the outputs of a
    # request its reader has not taken yet, so on a busy machine a chunk may be larger, and a token at a time may
    # come in as few chunks as four at a time (or fewer): the counts of the two runs are not compared.
    sizes = [len(o.token_ids) for o in four]
    assert sizes[0] == 1 and all(n >= 4 for n in sizes[1:-1]) and len(sizes) <= 7 and sum(sizes) == 22, sizes
    assert [t for o in four for t in o.token_ids] == [t for o in one for t in o.token_ids]
    assert "".join(o.text for o in four) == "".join(o.text for o in one)
    assert [lp.token for o in four for lp in o.logprobs or []] == [lp.token for o in one for lp in o.logprobs or []]
    assert four[-1].finished and not any(o.finished for o in four[:-1])



async def test_a_gated_reader_gets_the_outputs_made_meanwhile_joined_and_the_finish_wakes_it(
        engine: VllmEngine) -> None:
    """The worker's loop waits on its flush group's tick between outputs: vLLM's collector joins the outputs
    made meanwhile into one, and a finish opens the gate without a tick."""
    prompt, sampling = engine.apply_chat_template(STORY), Sampling(ignore_eos=True, logprobs=1)
    async with asyncio.timeout(120):
        plain = [out async for out in engine.generate(uuid.uuid4().hex, prompt, 24, 0, sampling)]
    gate, gated = ManualGate(), list[StepOutput]()

    async def read() -> None:
        async for out in engine.generate(uuid.uuid4().hex, prompt, 24, 0, sampling, gate=gate):
            gated.append(out)

    reader = asyncio.create_task(read())
    async with asyncio.timeout(120):
        while not gated:
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.3)  # several steps made behind the closed gate
        assert len(gated) == 1 and gate.waits == 1
        gate.opened.set()  # one tick
        while len(gated) < 2:
            await asyncio.sleep(0.01)
        await reader  # no more ticks: the finish opens the gate
    assert len(gated[1].token_ids) > 1 and gate.wakes == 1 and gated[-1].finished
    assert len(gated) <= 3 < len(plain)
    assert [t for o in gated for t in o.token_ids] == [t for o in plain for t in o.token_ids]
    assert "".join(o.text for o in gated) == "".join(o.text for o in plain)
    assert [lp.token for o in gated for lp in o.logprobs or []] == [lp.token for o in plain for lp in o.logprobs or []]


async def test_a_gated_reader_that_walks_away_frees_its_sequence(engine: VllmEngine) -> None:
    gate = ManualGate()
    stream = engine.generate(uuid.uuid4().hex, engine.apply_chat_template(STORY), 400, 0,
                             Sampling(ignore_eos=True), gate=gate)
    async with asyncio.timeout(120):
        await anext(stream)
        waiting = asyncio.create_task(anext(stream))  # parked at the gate
        await asyncio.sleep(0.2)
        waiting.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await waiting
        await stream.aclose()
        while engine._llm.output_processor.has_unfinished_requests():  # aborted: vLLM forgets it
            await asyncio.sleep(0.05)
    assert "Paris" in "".join(s.text for s in await _run(engine, QUESTION, 32))  # the engine still serves


async def test_identical_long_prompt_hits_the_prefix_cache(engine: VllmEngine) -> None:
    messages = [{"role": "system", "content": LONG_SYSTEM}, *QUESTION]
    first = await _run(engine, messages, 4)
    second = await _run(engine, messages, 4)

    assert first[0].prompt_tokens > 256
    assert 0 < second[0].cached_prompt_tokens < second[0].prompt_tokens
    assert (engine.stats()["prefix_cache_hit_rate"] or 0.0) > 0


async def test_chunked_prefill_and_priority_are_in_force(engine: VllmEngine) -> None:
    assert engine.effective["enable_chunked_prefill"] is True
    assert engine.effective["max_num_batched_tokens"] == 256
    assert engine.effective["scheduling_policy"] == "priority"
    # a prompt several chunks long still completes, at either priority
    messages = [{"role": "system", "content": LONG_SYSTEM * 2}, *QUESTION]
    paid, free = await asyncio.gather(_run(engine, messages, 8, priority=0), _run(engine, messages, 8, priority=10))
    assert paid[0].prompt_tokens > 3 * 256
    assert paid[-1].finished and free[-1].finished


async def test_concurrent_streams_are_batched_and_independent(engine: VllmEngine) -> None:
    together = await asyncio.gather(*(_run(engine, QUESTION, 32) for _ in range(4)))

    for steps in together:  # each stream carries its own tokens only
        text = "".join(s.text for s in steps)
        assert "Paris" in text
        assert text == engine.tokenizer.decode([t for s in steps for t in s.token_ids], skip_special_tokens=True)
    assert len({s.request_id for steps in together for s in steps}) == 4


async def test_prompt_longer_than_the_context_is_rejected_not_fatal(engine: VllmEngine) -> None:
    with pytest.raises(RequestRejected, match="3000.*2048"):
        async for _ in engine.generate(uuid.uuid4().hex, [1] * 3000, 8):
            pass
    assert "Paris" in "".join(s.text for s in await _run(engine, QUESTION, 32))  # the engine still serves
