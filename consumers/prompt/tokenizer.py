"""The model's own tokenizer, one per model folder, loaded once (no hub access)."""
from __future__ import annotations

import os
from functools import lru_cache
from pathlib import Path
from typing import Any


class ChatTokenizer:
    def __init__(self, model_dir: Path) -> None:
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        from transformers import AutoTokenizer  # heavy import, only where a tokenizer is needed

        self._tok: Any = AutoTokenizer.from_pretrained(str(model_dir))

    def count(self, text: str) -> int:
        return len(self._tok.encode(text, add_special_tokens=False))

    def chat_ids(self, messages: list[dict[str, str]]) -> list[int]:
        from consumers.generation.engine import render_chat  # the same rendering the worker's engine uses

        return render_chat(self._tok, messages)


@lru_cache(maxsize=8)
def tokenizer_for(model_dir: str) -> ChatTokenizer:
    return ChatTokenizer(Path(model_dir))
