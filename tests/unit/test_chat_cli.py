"""``parley chat`` output: stdout holds only the reply's text and ends with a newline; who answered, the
queue, errors and the figures go to stderr (so a one-shot reply pipes cleanly)."""
from __future__ import annotations

import json
import time
from typing import Any

import pytest

from producers import chat_cli


class Stream:
    """The lines of an SSE response, as httpx's ``iter_lines`` gives them."""

    def __init__(self, *frames: tuple[str, dict[str, Any]]) -> None:
        self.lines = []
        for n, (event, data) in enumerate(frames, 1):
            self.lines += [f"id: {n}", f"event: {event}", f"data: {json.dumps(data)}", ""]

    def iter_lines(self) -> Any:
        return iter(self.lines)


START = ("message_start", {"generation_id": "g1", "model": "SmolLM2", "pool": "small"})
END = ("message_end", {"stop_reason": "end", "usage": {"in": 5, "out": 3}})


def follow(capsys: Any, *frames: tuple[str, dict[str, Any]]) -> tuple[str, str, dict[str, Any]]:
    state: dict[str, Any] = {"sent": time.perf_counter()}
    chat_cli._follow(Stream(*frames), state)  # type: ignore[arg-type]
    out, err = capsys.readouterr()
    return out, err, state


def test_stdout_is_the_reply_and_ends_with_one_newline(capsys: pytest.CaptureFixture[str]) -> None:
    queued = ("queued", {"position": 2, "estimated_wait_s": 4})
    out, err, state = follow(capsys, START, queued, ("delta", {"text": "Hello"}), ("delta", {"text": " there."}), END)
    assert out == "Hello there.\n"
    assert err.startswith("[SmolLM2 via small] (queued: position 2, ~4 s) [end; 5 in / 3 out; TTFT")
    assert state["last_id"] == "5" and not state.get("failed")


def test_a_reply_ending_in_a_newline_gets_no_second_one(capsys: pytest.CaptureFixture[str]) -> None:
    out, _, _ = follow(capsys, START, ("delta", {"text": "line one\n"}), ("delta", {"text": ""}), END)
    assert out == "line one\n"


def test_an_error_is_on_stderr_after_the_text_line_is_ended(capsys: pytest.CaptureFixture[str]) -> None:
    failed = ("message_end", {"stop_reason": "error", "usage": {"in": 5, "out": 1}})
    out, err, state = follow(capsys, START, ("delta", {"text": "Par"}), ("error", {"message": "worker died"}),
                             failed)
    assert out == "Par\n" and "[error] worker died\n[error; 5 in / 1 out" in err and state["failed"]


def test_no_text_means_nothing_on_stdout(capsys: pytest.CaptureFixture[str]) -> None:
    out, err, _ = follow(capsys, START, ("message_end", {"stop_reason": "stopped", "usage": {"in": 5, "out": 0}}))
    assert out == "" and "[stopped; 5 in / 0 out" in err


def test_a_fallback_is_named_at_the_start_on_stderr(capsys: pytest.CaptureFixture[str]) -> None:
    moved = ("message_start", {"generation_id": "g1", "model": "SmolLM2", "pool": "small",
                               "route_reason": "overflow", "requested_pool": "large"})
    out, err, _ = follow(capsys, moved, ("delta", {"text": "Hi."}), END)
    assert out == "Hi.\n" and err.startswith("[SmolLM2 via small: large was busy] ")
    canned = ("message_start", {"generation_id": "g2", "model": "Parley prepared reply", "pool": "canned",
                                "route_reason": "canned", "requested_pool": "large"})
    _, err, _ = follow(capsys, canned, END)
    assert err.startswith("[Parley prepared reply via canned: every model was busy, a prepared reply] ")
