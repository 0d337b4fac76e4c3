"""The simulated engine's transport: the worker's Engine contract over SimCore, on a word tokenizer."""
from __future__ import annotations

import asyncio
import json

import pytest

from consumers.generation.engine import RequestRejected, StepOutput
from consumers.generation.sampling import Sampling
from consumers.generation.sim_engine import SimEngine
from infra.config.pools import PoolConfig, SimConfig
from schemas.sampling import ResponseFormat
from tests.fakes import FakeTokenizer, ManualGate


def engine(**sim: object) -> SimEngine:
    fast = {"weights_gb": 0.08, "reply_tokens": 40, **sim}  # a 10 µs step: the test waits on logic, not time
    pool = PoolConfig(name="sim", model_dir="/nowhere", uses_default_model=False, served_model_name="sim-model",
                      max_num_seqs=8, max_model_len=512, max_num_batched_tokens=512, engine="sim",
                      sim=SimConfig(**fast))  # type: ignore[arg-type]
    return SimEngine(pool, FakeTokenizer())


async def collect(e: SimEngine, rid: str, prompt: list[int], max_tokens: int = 200,
                  sampling: Sampling = Sampling()) -> list[StepOutput]:
    return [out async for out in e.generate(rid, prompt, max_tokens, 0, sampling)]


async def test_deltas_join_to_a_deterministic_reply_of_about_reply_tokens() -> None:
    e = engine()
    prompt = e.apply_chat_template([{"role": "user", "content": "tell me about the river"}])
    first, again = await collect(e, "a", prompt), await collect(e, "b", prompt)
    ids = [t for out in first for t in out.token_ids]
    assert 20 <= len(ids) <= 60
    assert "".join(o.text for o in first) == e.tokenizer.decode(ids)
    assert "".join(o.text for o in again) == "".join(o.text for o in first)  # same prompt, same reply
    assert first[-1].finished and first[-1].finish_reason == "stop" and not any(o.finished for o in first[:-1])
    assert first[-1].prompt_tokens == len(prompt)
    seeded = await collect(e, "c", prompt, sampling=Sampling(seed=1))
    assert "".join(o.text for o in seeded) != "".join(o.text for o in first)
    await e.close()


async def test_max_tokens_caps_the_reply_with_length_and_the_second_turn_hits_the_cache() -> None:
    e = engine(block_size=4)
    prompt = list(e.tokenizer.encode(" one two three four five six seven eight nine ten eleven twelve"))
    outs = await collect(e, "a", prompt, max_tokens=5)
    assert sum(len(o.token_ids) for o in outs) == 5 and outs[-1].finish_reason == "length"
    follow_up = prompt + [t for o in outs for t in o.token_ids] + prompt[:3]
    second = await collect(e, "b", follow_up, max_tokens=3)
    assert second[-1].cached_prompt_tokens == (len(prompt) + 5 - 1) // 4 * 4
    await e.close()


async def test_abort_ends_the_stream_within_a_step_and_the_engine_goes_idle() -> None:
    e = engine(weights_gb=40.0)  # a 5 ms step, so the abort lands mid-reply
    outs: list[StepOutput] = []
    seen = 0
    async for out in e.generate("a", [1, 2, 3], 400, 0, Sampling(ignore_eos=True)):
        outs.append(out)
        if len(outs) == 3:
            seen = sum(len(o.token_ids) for o in outs)
            await e.abort("a")
    assert outs[-1].finish_reason == "abort"
    assert sum(len(o.token_ids) for o in outs) <= seen + 1  # at most the step already on its way
    assert e.core.idle and e.stats()["running"] == 0 and e.core.kv_usage == 0
    await e.close()


async def test_a_consumer_that_walks_away_frees_its_sequence() -> None:
    e = engine(weights_gb=40.0)
    stream = e.generate("a", [1, 2, 3], 400, 0, Sampling(ignore_eos=True))
    await anext(stream)
    await stream.aclose()
    for _ in range(50):
        if e.core.idle:
            break
        await asyncio.sleep(0.01)
    assert e.core.idle
    await e.close()


async def test_requests_that_cannot_fit_are_rejected_not_fatal() -> None:
    e = engine()
    with pytest.raises(RequestRejected):
        await collect(e, "a", list(range(600)))
    served = await collect(e, "b", [1, 2])  # the engine still serves (a slow reader may get it as one output)
    assert served[-1].finished and served[-1].finish_reason == "stop" and sum(len(o.token_ids) for o in served) > 1
    await e.close()


async def test_ignore_eos_min_tokens_logprobs_and_json_are_honoured() -> None:
    e = engine()
    outs = await collect(e, "a", [5], max_tokens=90, sampling=Sampling(ignore_eos=True, logprobs=2))
    assert sum(len(o.token_ids) for o in outs) == 90 and outs[-1].finish_reason == "length"
    lp = outs[0].logprobs
    assert lp is not None and len(lp) == len(outs[0].token_ids) and "".join(t.token for t in lp) == outs[0].text
    assert all(len(t.top) == 2 for t in lp)
    longer = await collect(e, "b", [6], max_tokens=300, sampling=Sampling(min_tokens=150))
    assert sum(len(o.token_ids) for o in longer) >= 150
    js = await collect(e, "c", [7], sampling=Sampling(response_format=ResponseFormat(type="json_object")))
    assert set(json.loads("".join(o.text for o in js))) == {"text"}
    await e.close()


async def test_a_stream_interval_hands_over_the_first_token_alone_then_every_interval_then_the_rest() -> None:
    single, batched = engine(weights_gb=40.0), engine(weights_gb=40.0)  # 5 ms steps: each read before the next
    one = await collect(single, "a", [5, 6], max_tokens=20, sampling=Sampling(ignore_eos=True, logprobs=1))
    outs = await collect(batched, "a", [5, 6], max_tokens=20,
                         sampling=Sampling(ignore_eos=True, logprobs=1, stream_interval=3))
    assert [len(o.token_ids) for o in one] == [1] * 20
    assert [len(o.token_ids) for o in outs] == [1, 3, 3, 3, 3, 3, 3, 1]  # 20 = 1 + 6 x 3 + the last, at once
    assert [t for o in outs for t in o.token_ids] == [t for o in one for t in o.token_ids]
    assert "".join(o.text for o in outs) == "".join(o.text for o in one)
    assert all(o.logprobs is not None and len(o.logprobs) == len(o.token_ids) for o in outs)
    assert outs[-1].finished and not any(o.finished for o in outs[:-1])
    assert batched.sim_stats()["tokens"] == 20
    await single.close()
    await batched.close()


async def test_its_own_cpu_and_steps_are_counted_apart() -> None:
    e = engine()
    await asyncio.gather(*(collect(e, f"r{i}", [i, i + 1]) for i in range(8)))
    stats = e.sim_stats()
    assert stats["tokens"] > 8 * 19 and stats["steps"] >= 20 and stats["cpu_seconds"] > 0
    assert stats["virtual_seconds"] > 0
    await e.close()


async def test_a_fault_in_the_simulator_ends_every_stream_with_engine_dead_not_a_hang() -> None:
    from consumers.generation.engine import EngineDead

    e = engine()

    def broken() -> None:
        raise IndexError("a simulator fault")

    e.core.step = broken  # type: ignore[method-assign]
    with pytest.raises(EngineDead, match="simulated engine stopped"):
        await asyncio.wait_for(collect(e, "a", [1, 2]), 5)
    with pytest.raises(EngineDead):
        await collect(e, "b", [3])
    await e.close()


async def test_outputs_not_taken_yet_are_joined_into_one_as_vllm_does() -> None:
    e = engine(weights_gb=40.0)
    stream = e.generate("a", [5, 6], 12, 0, Sampling(ignore_eos=True, logprobs=1))
    first = await anext(stream)
    await asyncio.sleep(0.1)  # about 20 steps: the reply is made while nobody reads it
    rest = [out async for out in stream]
    assert len(first.token_ids) == 1 and len(rest) == 1
    assert len(rest[0].token_ids) == 11 and rest[0].finished and rest[0].finish_reason == "length"
    assert rest[0].logprobs is not None and len(rest[0].logprobs) == 11
    assert "".join(t.token for t in rest[0].logprobs) == rest[0].text
    await e.close()


async def test_a_gated_reader_takes_each_window_in_one_output_and_the_finish_wakes_it() -> None:
    e = engine(weights_gb=40.0)
    gate = ManualGate()
    outs: list[StepOutput] = []

    async def read() -> None:
        async for out in e.generate("a", [5, 6], 30, 0, Sampling(ignore_eos=True), gate=gate):
            outs.append(out)

    reader = asyncio.create_task(read())
    await asyncio.sleep(0.05)  # the first token, then about ten steps gathered behind the gate
    assert len(outs) == 1 and gate.waits == 1
    gate.opened.set()  # a tick
    await asyncio.sleep(0.01)
    assert len(outs) == 2 and len(outs[1].token_ids) >= 5
    async with asyncio.timeout(2):
        await reader  # no more ticks: only the finish opens the gate
    assert gate.wakes == 1 and outs[-1].finished and sum(len(o.token_ids) for o in outs) == 30
    assert len(outs) == 3
    await e.close()
