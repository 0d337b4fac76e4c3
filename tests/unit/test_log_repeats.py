"""A client library's repeated warning is let through once per interval, and the next says how many were held."""
from __future__ import annotations

import logging

from infra.config import logs


def _record(name: str, msg: str, *args: object, level: int = logging.ERROR) -> logging.LogRecord:
    return logging.LogRecord(name, level, __file__, 1, msg, args, None)


def test_the_same_library_warning_passes_once_per_interval_then_counts_what_was_held(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    now = [100.0]
    monkeypatch.setattr(logs.time, "monotonic", lambda: now[0])
    repeats = logs.Repeats(every_s=10.0)
    template = "Unable connect to node with id %s: %s"
    passed = []
    for i in range(50):  # five seconds of reconnect attempts, ten a second
        now[0] = 100.0 + i * 0.1
        passed.append(repeats.filter(_record("aiokafka.client", template, 3, "refused")))
    assert passed.count(True) == 1 and passed[0]
    now[0] = 111.0
    late = _record("aiokafka.client", template, 1, "refused")
    assert repeats.filter(late) and "[49 more like this in the last 11 s]" in late.getMessage()
    assert late.getMessage().startswith("Unable connect to node with id 1: refused")


def test_our_own_lines_and_library_info_lines_always_pass() -> None:
    repeats = logs.Repeats(every_s=10.0)
    assert all(repeats.filter(_record("consumers.generation.worker", "generation %s fenced off", i)) for i in range(5))
    assert all(repeats.filter(_record("aiokafka.consumer", "Joined group %s", "g", level=logging.INFO))
               for _ in range(5))
    other = [repeats.filter(_record("cassandra.cluster", "Host %s down", "h")),
             repeats.filter(_record("aiokafka.client", "Unable connect to node with id %s: %s", 1, "x"))]
    assert other == [True, True]  # a different template is a different complaint
