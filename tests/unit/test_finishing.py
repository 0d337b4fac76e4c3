"""The finish a worker writes: the user message it answers rides to persistence on ``chat.replies`` alone."""
from __future__ import annotations

import asyncio
from typing import Any

from consumers.generation.decisions import Limits, finished_event
from consumers.generation.finishing import Finisher
from consumers.generation.metrics import WorkerMetrics
from schemas import GenerationFinished, GenerationRequested, Usage, decode
from topics import Topics


class Producer:
    def __init__(self) -> None:
        self.sent: list[tuple[str, bytes]] = []

    async def send(self, topic: str, value: bytes, key: bytes, partition: int | None = None) -> asyncio.Future[Any]:
        self.sent.append((topic, value))
        done: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        done.set_result(None)
        return done


class Appender:
    def __init__(self) -> None:
        self.producer = Producer()

    async def landed(self, generation_id: str, sent: list[asyncio.Future[Any]]) -> None:
        await asyncio.gather(*sent)


class Fence:
    async def fenced(self, generation_id: str) -> bool:
        return False

    def epoch(self, generation_id: str) -> int:
        return 1


class Quota:
    async def free_slot(self, user_id: str, generation_id: str) -> None:
        pass


class Finished:
    def __init__(self) -> None:
        self.put_events: list[GenerationFinished] = []

    async def put(self, event: GenerationFinished) -> None:
        self.put_events.append(event)


async def _same(event: Any) -> Any:
    return event


async def test_the_question_goes_to_chat_replies_only() -> None:
    appender, finished = Appender(), Finished()
    limits = Limits(pool="large", model="m", max_model_len=4096)
    finisher = Finisher(limits, "w1", Topics("t."), appender, Fence(), Quota(), finished,  # type: ignore[arg-type]
                        WorkerMetrics("large"), _same)
    req = GenerationRequested(generation_id="g1", conversation_id="c", user_id="u", plan="paid", pool="large",
                              lane="paid", prompt_token_ids=[1, 2], max_tokens=8, message_id="g1", parent_id="um",
                              question="What is the capital of France?")
    await finisher.finish(finished_event(req, limits, "w1", "complete", "Paris.", Usage(prompt_tokens=2,
                                                                                        completion_tokens=2), 0))
    by_topic = {topic: decode(value, (GenerationFinished,)) for topic, value in appender.producer.sent}
    assert set(by_topic) == {"t.chat.tokens", "t.chat.replies"}
    replies, tokens = by_topic["t.chat.replies"], by_topic["t.chat.tokens"]
    assert isinstance(replies, GenerationFinished) and isinstance(tokens, GenerationFinished)
    assert replies.question == "What is the capital of France?"
    assert tokens.question == "" and finished.put_events[0].question == "" and tokens.text == "Paris."


async def test_a_finish_that_cannot_be_sealed_carries_no_text_at_all() -> None:
    from infra.stores.crypto import KeyGone

    async def gone(event: Any) -> Any:
        raise KeyGone(event.conversation_id)

    appender, limits = Appender(), Limits(pool="large", model="m", max_model_len=4096)
    finisher = Finisher(limits, "w1", Topics("t."), appender, Fence(), Quota(), Finished(),  # type: ignore[arg-type]
                        WorkerMetrics("large"), gone)
    req = GenerationRequested(generation_id="g1", conversation_id="c", user_id="u", plan="paid", pool="large",
                              lane="paid", prompt_token_ids=[1], max_tokens=8, message_id="g1", parent_id="um",
                              question="a secret question")
    await finisher.finish(finished_event(req, limits, "w1", "stopped", "a secret reply", Usage(), 0))
    assert appender.producer.sent and all(b"secret" not in value for _, value in appender.producer.sent)
