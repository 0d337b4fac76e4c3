"""The clients people already use, pointed at Parley with sampling parameters: LangChain's
``ChatOpenAI`` and litellm, invoke and stream."""
from __future__ import annotations

import argparse
import os
from pathlib import Path

import pytest

from tests.e2e.conftest import Caller
from tests.e2e.service import Service

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # litellm: no download of its price list

QUESTION = "Write two short paragraphs about lighthouses."


@pytest.fixture
def base_url(service: Service) -> str:
    return f"{service.url('gateway-a')}/v1"


async def test_langchain_invoke_and_stream_with_top_p_and_stop(base_url: str, alice: Caller) -> None:
    from langchain_openai import ChatOpenAI

    llm = ChatOpenAI(base_url=base_url, api_key=alice.token, model="large", top_p=0.95, stop=["\n\n"],  # type: ignore[arg-type]
                     max_tokens=48, temperature=0.7, max_retries=0)
    answer = await llm.ainvoke(QUESTION)
    assert isinstance(answer.content, str) and answer.content and "\n\n" not in answer.content
    pieces = [c.content async for c in llm.astream(QUESTION)]
    text = "".join(p for p in pieces if isinstance(p, str))
    assert len(pieces) > 2 and text and "\n\n" not in text


async def test_litellm_completion_and_stream_with_top_p_and_stop(base_url: str, alice: Caller) -> None:
    import litellm

    kwargs = {"model": "openai/large", "api_base": base_url, "api_key": alice.token, "top_p": 0.9,
              "stop": ["\n\n"], "max_tokens": 48, "messages": [{"role": "user", "content": QUESTION}]}
    resp = await litellm.acompletion(**kwargs)
    content = resp.choices[0].message.content
    assert content and "\n\n" not in content and resp.usage.completion_tokens > 0
    stream = await litellm.acompletion(**kwargs, stream=True)
    text = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
    assert text and "\n\n" not in text


def test_vllm_bench_random_dataset_runs_with_no_failed_request(service: Service, alice: Caller,
                                                               tmp_path: Path) -> None:
    """vLLM's own load tool with its default dataset (it sends ignore_eos), a small count."""
    from infra.local.model import ready_pool
    from tests.benchmarks.bench_peer import bench

    pool = ready_pool("large", service.settings)
    ns = argparse.Namespace(input_len=32, output_len=8, prompts_per_level=4)
    # One at a time: the plan runs 2 replies at once, and a finished reply's slot is freed by settlement a
    # moment after the client saw its end, so a back-to-back request at the cap could be refused (429).
    result = bench(service.url("gateway-a"), pool.model_dir, pool.served_model_name, 1, ns, "parley", alice.token,
                   out_dir=tmp_path)
    assert result["completed"] == 4 and result.get("failed", 0) == 0
    assert result["total_output_tokens"] == 4 * 8  # ignore_eos honoured: every reply ran to its length
