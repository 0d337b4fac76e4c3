"""The worker's sampling: a request's parameters -> one ``Sampling`` -> vLLM's ``SamplingParams`` fields.

Pure, no vLLM import at module level (the engine core re-imports this module). Replies sample at
the request's temperature with top_p 0.95 unless the client chose; a recovering worker rebuilds the
same ``Sampling`` from the same redelivered request (same seed), with ``min_tokens`` reduced by the
tokens already saved.
"""
from __future__ import annotations

import json
from typing import Any

import msgspec

from schemas import GenerationRequested
from schemas.sampling import ResponseFormat, TokenLogprob, TopLogprob

DEFAULT_TOP_P = 0.95  # Parley's own nucleus for sampled replies when the client names none


class Sampling(msgspec.Struct, frozen=True, kw_only=True):
    temperature: float = 0.0  # greedy unless asked
    top_p: float = 1.0
    top_k: int = 0  # 0: every token
    min_p: float = 0.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    min_tokens: int = 0
    ignore_eos: bool = False
    logprobs: int | None = None  # None: none; 0: the sampled token's only; k: plus the k most likely
    response_format: ResponseFormat | None = None
    stream_interval: int = 1  # tokens the engine gathers before handing them over (the first and last at once)


GREEDY = Sampling()


def for_request(req: GenerationRequested, saved_tokens: int = 0, max_tokens: int | None = None) -> Sampling:
    """``max_tokens``: what this run may still make (the plan's cap may be below the client's min_tokens)."""
    s = req.sampling
    default_top_p = DEFAULT_TOP_P if req.temperature > 0 else 1.0
    if s is None:
        return Sampling(temperature=req.temperature, top_p=default_top_p)
    if isinstance(s, str):  # the worker opens a sealed request before it samples
        raise TypeError(f"generation {req.generation_id}: sampling parameters still sealed")
    return Sampling(
        temperature=req.temperature, top_p=default_top_p if s.top_p is None else s.top_p,
        top_k=s.top_k or 0, min_p=s.min_p or 0.0, seed=s.seed, stop=tuple(s.stop or ()),
        presence_penalty=s.presence_penalty or 0.0, frequency_penalty=s.frequency_penalty or 0.0,
        repetition_penalty=1.0 if s.repetition_penalty is None else s.repetition_penalty,
        min_tokens=max(0, min((s.min_tokens or 0) - saved_tokens, max_tokens if max_tokens is not None else 1 << 30)),
        ignore_eos=s.ignore_eos,
        logprobs=s.top_logprobs if s.logprobs else None, response_format=s.response_format)


def vllm_kwargs(s: Sampling) -> dict[str, Any]:
    """``SamplingParams`` keyword arguments (without max_tokens and output kind, which the engine adds)."""
    kwargs: dict[str, Any] = {
        "temperature": s.temperature, "top_p": s.top_p, "top_k": s.top_k, "min_p": s.min_p, "seed": s.seed,
        "presence_penalty": s.presence_penalty, "frequency_penalty": s.frequency_penalty,
        "repetition_penalty": s.repetition_penalty, "min_tokens": s.min_tokens, "ignore_eos": s.ignore_eos,
        "logprobs": s.logprobs, "stream_interval": s.stream_interval,
        # The stop text itself is never part of the reply: vLLM cuts before it and holds back the
        # characters that might start one, so no delta ever carries a stop string.
        "stop": list(s.stop) or None, "include_stop_str_in_output": False,
    }
    if s.response_format is not None:
        kwargs["structured_outputs"] = structured(s.response_format)
    return kwargs


def structured(fmt: ResponseFormat) -> Any:
    from vllm.sampling_params import StructuredOutputsParams

    if fmt.type == "json_object":
        return StructuredOutputsParams(json_object=True)
    return StructuredOutputsParams(json=json.loads(fmt.json_schema or "{}"))


def logprobs_of(token_ids: tuple[int, ...], logprobs: Any, k: int) -> list[TokenLogprob] | None:
    """vLLM's per-token ``{token_id: Logprob}`` maps (the k most likely, plus the sampled token when it
    is not among them) -> the events' compact form."""
    if logprobs is None:
        return None
    out = []
    for token_id, ranked in zip(token_ids, logprobs, strict=False):
        chosen = ranked.get(token_id)
        top = sorted((lp for lp in ranked.values() if lp.rank is not None and lp.rank <= k), key=lambda lp: lp.rank)
        out.append(TokenLogprob(token=_text(chosen), logprob=float(chosen.logprob) if chosen else 0.0,
                                top=[TopLogprob(_text(lp), float(lp.logprob)) for lp in top]))
    return out


def _text(lp: Any) -> str:
    return (lp.decoded_token or "") if lp is not None else ""
