"""JSON Schema files for analysts, generated from the event classes.

``python -m schemas.jsonschema`` rewrites ``schemas/json/``; a unit test fails
when the committed files differ from what the classes say.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import msgspec

from schemas.codec import ALL_EVENTS

OUT_DIR = Path(__file__).parent / "json"


def render() -> dict[str, str]:
    """File name -> JSON text, one self-contained schema per event."""
    files: dict[str, str] = {}
    for cls in ALL_EVENTS:
        schema = msgspec.json.schema(cls)
        schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
        schema["x-version"] = cls.VERSION
        files[f"{cls.__name__}.json"] = json.dumps(schema, indent=2, sort_keys=True) + "\n"
    return files


def write(out_dir: Path = OUT_DIR) -> list[Path]:
    out_dir.mkdir(exist_ok=True)
    written = []
    for name, text in render().items():
        path = out_dir / name
        path.write_text(text)
        written.append(path)
    return written


if __name__ == "__main__":
    for p in write(Path(sys.argv[1]) if len(sys.argv) > 1 else OUT_DIR):
        print(p)
