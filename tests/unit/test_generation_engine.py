"""The engine interface's pure parts, and the test double the worker's unit tests rely on."""
from __future__ import annotations

import asyncio
import subprocess
import sys

from consumers.generation.engine import Engine, StepOutput, engine_kwargs, render_chat
from infra.config.pools import load_pools
from infra.config.settings import Settings
from tests.fakes import FakeEngine, FakeTokenizer


def test_engine_module_is_import_safe() -> None:
    """vLLM's engine core is a spawned process that re-imports us: importing must not pull in vLLM."""
    code = "import sys, consumers.generation.engine; print(sorted(m for m in ('vllm', 'torch') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_pool_maps_onto_engine_args(tmp_path) -> None:
    settings = Settings.from_env({"PARLEY_POOL_SMALL_KV_CACHE_GIB": "1"}).with_(cache_dir=tmp_path)
    pool = load_pools(settings, on_gpu=False)["small"]
    args = engine_kwargs(pool)

    assert args["model"] == str(tmp_path / "models" / "SmolLM2-135M-Instruct")
    assert args["kv_cache_memory_bytes"] == 2**30
    assert (args["max_num_seqs"], args["max_num_batched_tokens"], args["max_model_len"]) == (8, 256, 2048)
    assert args["enable_chunked_prefill"] and args["enable_prefix_caching"] and args["enforce_eager"]
    assert args["scheduling_policy"] == "priority"


def test_render_chat_ends_with_the_assistant_turn() -> None:
    tok = FakeTokenizer()
    ids = render_chat(tok, [{"role": "user", "content": "Hi there"}])

    assert tok.decode(ids) == "<user> Hi there\n<assistant>"


async def _collect(engine: Engine, request_id: str, prompt: list[int], max_tokens: int) -> list[StepOutput]:
    return [out async for out in engine.generate(request_id, prompt, max_tokens)]


async def test_fake_engine_streams_deltas_that_join_to_the_reply() -> None:
    engine = FakeEngine(reply="The capital of France is Paris.")
    steps = await _collect(engine, "g1", engine.apply_chat_template([{"role": "user", "content": "?"}]), 100)

    assert "".join(s.text for s in steps) == "The capital of France is Paris."
    assert [s.finished for s in steps] == [False] * (len(steps) - 1) + [True]
    assert steps[-1].finish_reason == "stop"


async def test_fake_engine_stops_at_max_tokens() -> None:
    steps = await _collect(FakeEngine(reply="one two three four"), "g1", [1, 2], 2)

    assert sum(len(s.token_ids) for s in steps) == 2 and steps[-1].finish_reason == "length"


async def test_fake_engine_abort_ends_the_stream_and_is_recorded() -> None:
    engine = FakeEngine(reply=" ".join(["word"] * 50), step_delay=0.001)
    steps: list[StepOutput] = []
    async for out in engine.generate("g1", [1, 2, 3], 50):
        steps.append(out)
        if len(steps) == 3:
            await engine.abort("g1")

    assert steps[-1].finish_reason == "abort" and steps[-1].token_ids == ()
    assert sum(len(s.token_ids) for s in steps) == 3
    assert engine.aborts == ["g1"]


async def test_fake_engine_reports_whole_cached_blocks_for_a_repeated_prefix() -> None:
    engine = FakeEngine(block_size=4)
    prompt = list(range(10))
    first = await _collect(engine, "a", prompt, 3)
    second = await _collect(engine, "b", prompt + [99], 3)

    assert first[0].cached_prompt_tokens == 0
    assert second[0].cached_prompt_tokens == 8


async def test_fake_engine_runs_requests_concurrently() -> None:
    engine = FakeEngine(reply="a b c d", step_delay=0.01)
    results = await asyncio.gather(*(_collect(engine, f"g{i}", [i], 10) for i in range(4)))

    assert all("".join(s.text for s in r) == "a b c d" for r in results)
    assert engine.stats()["running"] == 0
