"""One event loop for every long-running process: uvloop's (the gateway gets it through uvicorn)."""
from __future__ import annotations

from collections.abc import Coroutine
from typing import Any, TypeVar

import uvloop

T = TypeVar("T")


def run(main: Coroutine[Any, Any, T]) -> T:
    """``asyncio.run`` on uvloop: the same semantics, a loop written in C (less CPU per event)."""
    return uvloop.run(main)
