"""The worker's sampling: a request's parameters -> ``Sampling`` -> vLLM's ``SamplingParams``, and the
events keeping them from the gateway to a recovering worker."""
from __future__ import annotations

import json
from types import SimpleNamespace

from consumers.generation.sampling import DEFAULT_TOP_P, Sampling, for_request, logprobs_of, vllm_kwargs
from schemas import GenerationRequested, decode, encode
from schemas.sampling import ResponseFormat
from schemas.sampling import Sampling as Asked


def request(**kw: object) -> GenerationRequested:
    return GenerationRequested(generation_id="g", conversation_id="c", user_id="u", plan="paid", pool="large",
                               lane="paid", prompt_token_ids=[1, 2], max_tokens=30, **kw)  # type: ignore[arg-type]


def test_without_client_parameters_replies_sample_as_before() -> None:
    assert for_request(request(temperature=0.7)) == Sampling(temperature=0.7, top_p=DEFAULT_TOP_P)
    assert for_request(request(temperature=0.0)) == Sampling(temperature=0.0, top_p=1.0)


def test_client_parameters_reach_vllm_under_its_names() -> None:
    asked = Asked(top_p=0.9, top_k=40, min_p=0.05, seed=1, stop=["\n\n"], presence_penalty=0.1,
                  frequency_penalty=0.2, repetition_penalty=1.1, min_tokens=5, ignore_eos=True, logprobs=True,
                  top_logprobs=3)
    kwargs = vllm_kwargs(for_request(request(temperature=0.8, sampling=asked)))
    assert kwargs == {"temperature": 0.8, "top_p": 0.9, "top_k": 40, "min_p": 0.05, "seed": 1,
                      "presence_penalty": 0.1, "frequency_penalty": 0.2, "repetition_penalty": 1.1,
                      "min_tokens": 5, "ignore_eos": True, "logprobs": 3, "stream_interval": 1, "stop": ["\n\n"],
                      "include_stop_str_in_output": False}
    from vllm import SamplingParams  # the real class accepts every one of them

    params = SamplingParams(max_tokens=30, **kwargs)
    assert params.stop == ["\n\n"] and params.seed == 1 and params.logprobs == 3


def test_a_recovering_worker_keeps_the_seed_and_owes_only_the_remaining_min_tokens() -> None:
    req = request(temperature=0.8, sampling=Asked(seed=7, min_tokens=10, stop=["END"]))
    again = decode(encode(req), (GenerationRequested,))  # the redelivered record
    resumed = for_request(again, saved_tokens=4)  # type: ignore[arg-type]
    assert resumed.seed == 7 and resumed.min_tokens == 6 and resumed.stop == ("END",)
    assert for_request(again, saved_tokens=40).min_tokens == 0  # type: ignore[arg-type]
    assert for_request(again, max_tokens=3).min_tokens == 3  # type: ignore[arg-type]  # the plan's cap is lower


def test_structured_outputs_become_vllm_constraints() -> None:
    obj = vllm_kwargs(Sampling(response_format=ResponseFormat(type="json_object")))["structured_outputs"]
    assert obj.json_object is True
    schema = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
    fmt = ResponseFormat(type="json_schema", json_schema=json.dumps(schema))
    assert vllm_kwargs(Sampling(response_format=fmt))["structured_outputs"].json == schema


def test_old_records_without_sampling_still_decode() -> None:
    old = b'{"type":"GenerationRequested","v":1,"generation_id":"g","conversation_id":"c","user_id":"u",' \
          b'"plan":"free","pool":"large","lane":"free","prompt_token_ids":[1],"max_tokens":4}'
    req = decode(old, (GenerationRequested,))
    assert req.sampling is None  # type: ignore[attr-defined]


def test_logprobs_keep_the_sampled_token_and_the_k_most_likely() -> None:
    lp = SimpleNamespace
    step = [{5: lp(logprob=-0.1, rank=1, decoded_token="Hi"), 6: lp(logprob=-2.5, rank=2, decoded_token="Yo")},
            {9: lp(logprob=-3.0, rank=7, decoded_token="!"), 2: lp(logprob=-0.2, rank=1, decoded_token=".")}]
    out = logprobs_of((5, 9), step, k=1)
    assert out is not None and [(t.token, t.logprob) for t in out] == [("Hi", -0.1), ("!", -3.0)]
    assert [[(a.token, a.logprob) for a in t.top] for t in out] == [[("Hi", -0.1)], [(".", -0.2)]]
    assert logprobs_of((5,), None, 1) is None
