"""The OpenAI stream's transport without a broker: chunk order, and a client that leaves cancels."""
from __future__ import annotations

import asyncio
from collections.abc import MutableMapping
from dataclasses import dataclass, field
from typing import Any

import orjson
import pytest

from infra.config.settings import Settings
from producers.gateway import jobs, routes_openai, submission
from producers.gateway.submission import Accepted
from schemas import GenerationFinished, GenerationQueued, TokensAppended, Usage, new_id


class FakeRelay:
    def __init__(self) -> None:
        self.unsubscribed: list[str] = []

    def unsubscribe(self, generation_id: str, _: object) -> None:
        self.unsubscribed.append(generation_id)


@dataclass
class FakeGateway:
    relay: FakeRelay = field(default_factory=FakeRelay)
    settings: Settings = field(default_factory=lambda: Settings().with_(reader_timeout_s=3.0))
    keepalive_s: float = 0.05
    beats: int = 0

    async def reader_beat(self, generation_id: str) -> None:
        self.beats += 1


@pytest.fixture
def cancels(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    sent: list[str] = []

    async def cancel(gw: object, generation_id: str, conversation_id: str, user_id: str) -> None:
        sent.append(generation_id)

    monkeypatch.setattr(submission, "cancel", cancel)
    return sent


def job_with(*events: Any, index: int = 0) -> jobs.Job:
    queue: asyncio.Queue[tuple[int, Any]] = asyncio.Queue()
    for offset, event in enumerate(events):
        queue.put_nowait((offset, event))
    gid = events[0].generation_id if events else new_id()
    return jobs.Job(FakeGateway(), Accepted(gid, queue, []), "c", "u", "Smol", index)  # type: ignore[arg-type]


def ids(gid: str) -> dict[str, Any]:
    return {"generation_id": gid, "conversation_id": "c", "user_id": "u"}


def payloads(lines: list[bytes]) -> list[Any]:
    return [line[6:-2].decode() if line == b"data: [DONE]\n\n" else orjson.loads(line[6:]) for line in lines
            if line.startswith(b"data: ")]


async def test_a_whole_stream_is_role_deltas_finish_usage_done(cancels: list[str]) -> None:
    gid = new_id()
    job = job_with(
        GenerationQueued(**ids(gid), pool="large", model="Served", lane="paid", position=0, estimated_wait_s=0),
        TokensAppended(**ids(gid), seq=0, text="Hel", token_ids=[1]),
        TokensAppended(**ids(gid), seq=1, text="", token_ids=[2]),  # end of sequence: nothing to show
        TokensAppended(**ids(gid), seq=2, text="lo", token_ids=[3]),
        GenerationFinished(**ids(gid), plan="paid", message_id="m", status="length", text="Hello",
                           usage=Usage(prompt_tokens=9, completion_tokens=3), model="Served", pool="large",
                           worker_id="w"))
    out = payloads([line async for line in routes_openai._chunks([job], include_usage=True)])
    assert out[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert [c["choices"][0]["delta"] for c in out[1:3]] == [{"content": "Hel"}, {"content": "lo"}]
    assert out[1]["model"] == "Served" and out[3]["choices"][0]["finish_reason"] == "length"
    assert out[4]["choices"] == [] and out[4]["usage"]["total_tokens"] == 12 and out[5] == "[DONE]"
    assert cancels == [] and job.gw.relay.unsubscribed == [gid]  # type: ignore[attr-defined]


async def test_a_record_of_several_tokens_is_one_chunk_with_a_logprob_per_token(cancels: list[str]) -> None:
    """A flush window's record (three tokens) streams as one chunk: its whole text, and one logprob entry per token
    in order, as OpenAI's clients add them up; the next record's tokens follow in the next chunk."""
    from schemas.sampling import TokenLogprob, TopLogprob

    gid = new_id()
    lp = [TokenLogprob(t, -0.5 * (i + 1), [TopLogprob(t, -0.5 * (i + 1))]) for i, t in enumerate(["Hel", "lo", ","])]
    job = job_with(
        TokensAppended(**ids(gid), seq=0, text="Hello,", token_ids=[1, 2, 3], logprobs=lp),
        TokensAppended(**ids(gid), seq=1, text=" world", token_ids=[4], logprobs=[TokenLogprob(" world", -0.1, [])]),
        GenerationFinished(**ids(gid), plan="paid", message_id="m", status="complete", text="Hello, world",
                           usage=Usage(prompt_tokens=9, completion_tokens=4), model="Served", pool="large",
                           worker_id="w"))
    out = payloads([line async for line in routes_openai._chunks([job], include_usage=False)])
    first, second = out[1]["choices"][0], out[2]["choices"][0]
    assert first["delta"] == {"content": "Hello,"} and second["delta"] == {"content": " world"}
    assert [e["token"] for e in first["logprobs"]["content"]] == ["Hel", "lo", ","]
    assert [e["logprob"] for e in first["logprobs"]["content"]] == [-0.5, -1.0, -1.5]
    assert [e["token"] for e in second["logprobs"]["content"]] == [" world"]
    assert "".join(e["token"] for c in (first, second) for e in c["logprobs"]["content"]) == "Hello, world"
    assert out[3]["choices"][0]["finish_reason"] == "stop" and out[-1] == "[DONE]"


async def test_leaving_before_the_end_cancels_once(cancels: list[str]) -> None:
    gid = new_id()
    job = job_with(TokensAppended(**ids(gid), seq=0, text="Once", token_ids=[1]))
    stream = routes_openai._chunks([job], include_usage=False)
    assert b"assistant" in await stream.__anext__() and b"Once" in await stream.__anext__()
    await stream.aclose()  # parked at a yield: the client went away
    job.close()  # the response closes it again: still one cancel
    await asyncio.sleep(0)
    assert cancels == [gid]


async def test_a_client_disconnect_seen_by_starlette_cancels_the_generation(cancels: list[str]) -> None:
    gid = new_id()
    job = job_with(TokensAppended(**ids(gid), seq=0, text="Hi", token_ids=[1]))
    response = jobs.CancelOnLeave(routes_openai._chunks([job], False), [job], media_type="text/event-stream")
    sent: list[MutableMapping[str, Any]] = []
    got_body = asyncio.Event()

    async def send(message: MutableMapping[str, Any]) -> None:
        sent.append(message)
        if b"Hi" in message.get("body", b""):
            got_body.set()

    async def receive() -> MutableMapping[str, Any]:
        await got_body.wait()
        return {"type": "http.disconnect"}

    await asyncio.wait_for(response({"type": "http", "asgi": {"spec_version": "2.3"}}, receive, send), 5)
    await asyncio.sleep(0)
    assert cancels == [gid] and job.finished
    assert not any(b"[DONE]" in m.get("body", b"") for m in sent)


async def test_text_no_delta_carried_arrives_before_the_finish(cancels: list[str]) -> None:
    gid = new_id()  # a prepared reply: queued and finished at once, no token events
    job = job_with(
        GenerationQueued(**ids(gid), pool="canned", model="Prepared", lane="free", position=0, estimated_wait_s=0),
        GenerationFinished(**ids(gid), plan="free", message_id="m", status="complete", text="Try later.",
                           usage=Usage(), model="Prepared", pool="canned", worker_id="scheduler"))
    out = payloads([line async for line in routes_openai._chunks([job], include_usage=False)])
    assert [c["choices"][0]["delta"] for c in out[:-1]] == [{"role": "assistant", "content": ""},
                                                             {"content": "Try later."}, {}]
    assert out[2]["choices"][0]["finish_reason"] == "stop" and out[-1] == "[DONE]" and cancels == []


def finish(gid: str, text: str, out: int) -> GenerationFinished:
    return GenerationFinished(**ids(gid), plan="paid", message_id="m", status="complete", text=text,
                              usage=Usage(prompt_tokens=5, completion_tokens=out), model="Served", pool="large",
                              worker_id="w")


async def test_n_choices_stream_with_their_index_and_end_once_all_have(cancels: list[str]) -> None:
    a, b = new_id(), new_id()
    first = job_with(TokensAppended(**ids(a), seq=0, text="A1", token_ids=[1]), finish(a, "A1", 1))
    second = job_with(TokensAppended(**ids(b), seq=0, text="B1", token_ids=[1]),
                      TokensAppended(**ids(b), seq=1, text="B2", token_ids=[2]), finish(b, "B1B2", 2), index=1)
    out = payloads([line async for line in routes_openai._chunks([first, second], include_usage=True)])
    assert out[-1] == "[DONE]" and out[-2]["choices"] == [] and out[-2]["usage"]["completion_tokens"] == 3
    deltas: dict[int, str] = {0: "", 1: ""}
    finishes = []
    for c in out[:-2]:
        choice = c["choices"][0]
        deltas[choice["index"]] += choice["delta"].get("content", "")
        if choice["finish_reason"]:
            finishes.append(choice["index"])
    assert deltas == {0: "A1", 1: "B1B2"} and sorted(finishes) == [0, 1]
    assert len({c["id"] for c in out[:-1]}) == 1 and cancels == []


async def test_a_background_response_is_never_cancelled_by_its_client_leaving(cancels: list[str]) -> None:
    from producers.gateway import routes_responses

    gid = new_id()
    job = job_with(TokensAppended(**ids(gid), seq=0, text="Once", token_ids=[1]))
    job.detached = True
    stream = routes_responses._live(job, {"background": True})
    first = [await stream.__anext__() for _ in range(5)]  # created, in_progress, item, part, the delta
    assert b"response.output_text.delta" in first[-1] and b'"sequence_number":4' in first[-1]
    await stream.aclose()  # the client went away mid-reply
    job.close()
    await asyncio.sleep(0)
    assert cancels == [] and job.gw.relay.unsubscribed  # type: ignore[attr-defined]


async def test_the_role_chunk_comes_with_the_first_token_not_before_it(cancels: list[str]) -> None:
    """vLLM's server and OpenAI send a choice's role with its first token; a client timing the first chunk (vLLM's
    benchmark does) must be timing the first token, not the request's acceptance."""
    gid = new_id()
    queue: asyncio.Queue[tuple[int, Any]] = asyncio.Queue()
    queue.put_nowait((0, GenerationQueued(**ids(gid), pool="large", model="Served", lane="paid", position=3,
                                          estimated_wait_s=2)))
    job = jobs.Job(FakeGateway(), Accepted(gid, queue, []), "c", "u", "Smol", 0)  # type: ignore[arg-type]

    async def first_token_later() -> None:
        await asyncio.sleep(0.2)  # four keep-alive intervals with no token yet
        queue.put_nowait((1, TokensAppended(**ids(gid), seq=0, text="Hi", token_ids=[1])))

    later = asyncio.create_task(first_token_later())
    lines: list[bytes] = []
    async for line in routes_openai._chunks([job], include_usage=False):
        lines.append(line)
        if b'"Hi"' in line:
            break
    await later
    data = [i for i, line in enumerate(lines) if line.startswith(b"data: ")]
    assert data[0] > 0 and all(line == routes_openai.BLANK_KEEPALIVE for line in lines[:data[0]])
    assert payloads(lines)[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert payloads(lines)[1]["choices"][0]["delta"] == {"content": "Hi"}


async def test_vllm_benchmarks_stream_parser_sees_every_chunk_after_keep_alives(cancels: list[str]) -> None:
    """vLLM's benchmark strips each network read and splits on blank lines: a keep-alive read on its own must not
    swallow the chunks after it (a comment did, and a queued reply came back with none)."""
    from vllm.benchmarks.lib.endpoint_request_func import StreamedResponseHandler

    gid = new_id()
    queue: asyncio.Queue[tuple[int, Any]] = asyncio.Queue()
    job = jobs.Job(FakeGateway(), Accepted(gid, queue, []), "c", "u", "Smol", 0)  # type: ignore[arg-type]

    async def later() -> None:
        await asyncio.sleep(0.2)  # queued: keep-alives go out meanwhile
        for seq, text in enumerate(("Hel", "lo")):
            queue.put_nowait((seq, TokensAppended(**ids(gid), seq=seq, text=text, token_ids=[seq])))
        queue.put_nowait((2, GenerationFinished(**ids(gid), plan="paid", message_id="m", status="complete",
                                                text="Hello", usage=Usage(prompt_tokens=3, completion_tokens=2),
                                                model="Served", pool="large", worker_id="w")))

    feeding = asyncio.create_task(later())
    handler, messages = StreamedResponseHandler(), []
    async for read in routes_openai._chunks([job], include_usage=False):  # each yield arrives as its own read
        if read.strip():
            messages += handler.add_chunk(read.strip())
    await feeding
    chunks = [orjson.loads(m.removeprefix("data: ")) for m in messages if m.startswith("data: {")]
    assert "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks) == "Hello"
    assert messages[-1] == "data: [DONE]"
