"""The prompt build's token counts are remembered by digest: counted once, bounded, and no text kept."""
from __future__ import annotations

from collections import OrderedDict
from typing import Any

import pytest

from consumers.prompt import tokenizer as tokenizer_module
from consumers.prompt.tokenizer import ChatTokenizer


class _Encoder:
    def __init__(self) -> None:
        self.calls = 0

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        self.calls += 1
        return list(range(len(text.split())))


def _tokenizer() -> tuple[ChatTokenizer, _Encoder]:
    tok = ChatTokenizer.__new__(ChatTokenizer)
    enc = _Encoder()
    tok._tok, tok._counts = enc, OrderedDict()  # noqa: SLF001 - no model folder in a unit test
    return tok, enc


def test_a_text_is_counted_once_and_its_text_is_not_kept() -> None:
    tok, enc = _tokenizer()
    secret = "my bank password is hunter2 and more words"
    assert tok.count(secret) == 8 and tok.count(secret) == 8 and enc.calls == 1
    assert tok.count(secret + " !") == 9 and enc.calls == 2
    kept: Any = tok._counts  # noqa: SLF001
    assert all(b"hunter2" not in key and len(key) == 16 for key in kept)
    assert tok.count("\ud800 lone surrogate") == 3  # whatever a client sent, no encoding error


def test_the_counts_kept_are_bounded_least_recent_out(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tokenizer_module, "COUNTS_KEPT", 3)
    tok, enc = _tokenizer()
    for text in ("a", "b", "c"):
        tok.count(text)
    tok.count("a")  # a is the most recent now
    tok.count("d")  # b goes
    assert len(tok._counts) == 3  # noqa: SLF001
    calls = enc.calls
    tok.count("a")
    tok.count("b")
    assert enc.calls == calls + 1  # a was kept, b counted again
