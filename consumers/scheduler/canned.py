"""The last-resort tier: prepared replies for the most common prompts, served when every pool is
past the plan's wait limit. Pure lookup; the table is ``Settings.canned_file`` (``infra/config/canned.toml``)."""
from __future__ import annotations

import re
import tomllib
from collections.abc import Mapping
from pathlib import Path

DEFAULT_FILE = Path(__file__).resolve().parents[2] / "infra" / "config" / "canned.toml"
CANNED_POOL = "canned"
CANNED_MODEL = "Parley prepared reply"


def normalise(text: str) -> str:
    return re.sub(r"\s+", " ", text.strip().lower()).rstrip(" ?!.")


class CannedReplies:
    def __init__(self, table: Mapping[str, str]) -> None:
        self.table = {normalise(k): v for k, v in table.items()}

    @classmethod
    def load(cls, path: Path = DEFAULT_FILE) -> CannedReplies:
        with path.open("rb") as fh:
            return cls(tomllib.load(fh).get("replies", {}))

    def reply_for(self, question: str) -> str | None:
        return self.table.get(normalise(question))
