"""The model's own tokenizer, one per model folder, loaded once (no hub access).

``count`` remembers what it counted: the prompt build counts every turn of a conversation's history again at
each new message (and the shared system prompt at every request), which made the token counting most of the
prompt stage's CPU. It keeps each text's count under the text's digest, never the text, so nothing a user
wrote outlives the request in this process's memory.
"""
from __future__ import annotations

import hashlib
import os
from collections import OrderedDict
from functools import lru_cache
from pathlib import Path
from typing import Any

COUNTS_KEPT = 16_384  # texts' counts remembered per tokenizer (a digest and an int each: about 2 MiB)


class ChatTokenizer:
    def __init__(self, model_dir: Path) -> None:
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        from transformers import AutoTokenizer  # heavy import, only where a tokenizer is needed

        self._tok: Any = AutoTokenizer.from_pretrained(str(model_dir))
        self._counts: OrderedDict[bytes, int] = OrderedDict()  # digest of a text -> its count, least recent first

    def count(self, text: str) -> int:
        key = hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=16).digest()
        counted = self._counts.get(key)
        if counted is not None:
            self._counts.move_to_end(key)
            return counted
        counted = len(self._tok.encode(text, add_special_tokens=False))
        self._counts[key] = counted
        if len(self._counts) > COUNTS_KEPT:
            self._counts.popitem(last=False)
        return counted

    def chat_ids(self, messages: list[dict[str, str]]) -> list[int]:
        from consumers.generation.engine import render_chat  # the same rendering the worker's engine uses

        return render_chat(self._tok, messages)


@lru_cache(maxsize=8)
def tokenizer_for(model_dir: str) -> ChatTokenizer:
    return ChatTokenizer(Path(model_dir))
