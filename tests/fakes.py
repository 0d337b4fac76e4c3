"""Test doubles. Nothing here is used by the service itself.

``FakeEngine`` stands in for ``consumers.generation.engine.VllmEngine`` in unit tests of the generation worker:
it streams a premade reply one step at a time (with an optional delay per step, so cancels and
batching can be exercised), records every request and abort, and imitates the prefix cache
closely enough to test the ``cached_prompt_tokens`` plumbing. It tokenises by word, so ids are
stable within one engine and the deltas always concatenate to the reply.
"""
from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from consumers.generation.engine import GREEDY, EngineStats, Sampling, StepOutput

_PIECES = re.compile(r"\s*\S+|\s+")  # a word with the space before it: pieces join back exactly


class FakeTokenizer:
    """Word-level tokenizer: each distinct piece gets the next id; decode joins the pieces."""

    def __init__(self) -> None:
        self.vocab: dict[str, int] = {}
        self.pieces: list[str] = []

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return [self._id(piece) for piece in _PIECES.findall(text)]

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return "".join(self.pieces[i] for i in ids)

    def apply_chat_template(self, messages: list[Mapping[str, str]], tokenize: bool = False,
                            add_generation_prompt: bool = True) -> str:
        text = "".join(f"<{m['role']}> {m['content']}\n" for m in messages)
        return text + ("<assistant>" if add_generation_prompt else "")

    def _id(self, piece: str) -> int:
        if piece not in self.vocab:
            self.vocab[piece] = len(self.pieces)
            self.pieces.append(piece)
        return self.vocab[piece]


@dataclass
class FakeRequest:
    request_id: str
    prompt_token_ids: list[int]
    max_tokens: int
    priority: int
    sampling: Sampling


@dataclass
class FakeEngine:
    """Streams ``reply`` in steps of ``tokens_per_step`` tokens, sleeping ``step_delay`` s per step."""

    reply: str = "The capital of France is Paris."
    step_delay: float = 0.0
    tokens_per_step: int = 1
    block_size: int = 16  # prefix-cache granularity, as in vLLM: only whole blocks are reused
    fail_after_steps: int | None = None  # raise RuntimeError after this many steps (engine failure)
    dead_after_steps: int | None = None  # raise EngineDead after this many steps (the engine process is gone)
    model_name: str = "fake-model"
    requests: list[FakeRequest] = field(default_factory=list)
    aborts: list[str] = field(default_factory=list)
    closed: bool = False
    _tokenizer: FakeTokenizer = field(default_factory=FakeTokenizer)
    _running: set[str] = field(default_factory=set)
    _aborted: set[str] = field(default_factory=set)
    _seen_prompts: list[list[int]] = field(default_factory=list)

    @property
    def tokenizer(self) -> FakeTokenizer:
        return self._tokenizer

    def apply_chat_template(self, messages: Sequence[Mapping[str, str]]) -> list[int]:
        return self._tokenizer.encode(self._tokenizer.apply_chat_template(list(messages)))

    async def generate(
        self,
        request_id: str,
        prompt_token_ids: Sequence[int],
        max_tokens: int,
        priority: int = 0,
        sampling: Sampling = GREEDY,
        gate: Any = None,  # not waited on: this engine makes each output only when asked, so none would join
    ) -> AsyncIterator[StepOutput]:
        prompt = list(prompt_token_ids)
        self.requests.append(FakeRequest(request_id, prompt, max_tokens, priority, sampling))
        cached = self._cached_prefix(prompt)
        reply = self._tokenizer.encode(self.reply)[:max_tokens]
        self._running.add(request_id)
        try:
            for step, start in enumerate(range(0, max(len(reply), 1), self.tokens_per_step)):
                await asyncio.sleep(self.step_delay)
                if request_id in self._aborted:
                    yield self._out(request_id, prompt, cached, [], "abort")
                    return
                if self.fail_after_steps is not None and step >= self.fail_after_steps:
                    raise RuntimeError("fake engine failure")
                if self.dead_after_steps is not None and step >= self.dead_after_steps:
                    from consumers.generation.engine import EngineDead
                    raise EngineDead("fake engine process gone")
                ids = reply[start:start + self.tokens_per_step]
                done = start + self.tokens_per_step >= len(reply)
                reason = None if not done else ("length" if len(reply) == max_tokens else "stop")
                yield self._out(request_id, prompt, cached, ids, reason)
        finally:
            self._running.discard(request_id)

    async def abort(self, request_id: str) -> None:
        self.aborts.append(request_id)
        if request_id in self._running:
            self._aborted.add(request_id)

    def stats(self) -> EngineStats:
        return EngineStats(running=len(self._running), waiting=0, kv_cache_usage=0.0,
                           prefix_cache_hit_rate=None)

    async def close(self) -> None:
        self.closed = True

    def _cached_prefix(self, prompt: list[int]) -> int:
        best = 0
        for seen in self._seen_prompts:
            pairs = enumerate(zip(seen, prompt, strict=False))
            common = next((i for i, (a, b) in pairs if a != b), min(len(seen), len(prompt)))
            best = max(best, common)
        self._seen_prompts.append(prompt)
        return min(best // self.block_size * self.block_size, max(len(prompt) - 1, 0))

    def _out(self, request_id: str, prompt: list[int], cached: int, ids: list[int],
             reason: str | None) -> StepOutput:
        return StepOutput(request_id=request_id, token_ids=tuple(ids), text=self._tokenizer.decode(ids),
                          finished=reason is not None, finish_reason=reason, prompt_tokens=len(prompt),
                          cached_prompt_tokens=cached)


class ManualGate:
    """An engine ``Gate`` that opens when a test sets ``opened`` (a tick), or when the engine wakes it at a
    finish; counts both."""

    def __init__(self) -> None:
        self.opened = asyncio.Event()
        self.waits = self.wakes = 0

    async def wait(self) -> None:
        self.waits += 1
        await self.opened.wait()
        self.opened.clear()

    def wake(self) -> None:
        self.wakes += 1
        self.opened.set()
