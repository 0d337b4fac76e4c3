"""Rolling summaries of the turns that no longer fit: what to ask the small pool, and when.

A request covers the previous summary plus the turns dropped since, so each summary
carries everything before it. One is in flight per conversation at a time (a Redis
``SET NX`` that persistence clears when the summary is saved); a new one is asked
for once the stored one misses more than one dropped turn.
"""
from __future__ import annotations

from typing import Any

from consumers.prompt.fit import Turn
from infra.stores.records import Summary

SUMMARY_INSTRUCTION = "Summarise this conversation in at most five sentences, keeping names, numbers and decisions."
SUMMARY_MAX_TOKENS = 160
IN_FLIGHT_S = 60  # a summary lost on the way (a worker died) blocks the next one for at most this long


def wanted(dropped_upto: int | None, summary: Summary | None) -> bool:
    """Pure: whether the dropped turns need a (newer) summary."""
    if dropped_upto is None:
        return False
    return summary is None or summary.upto_turn < dropped_upto - 1


def summary_messages(turns: list[Turn], upto: int, previous: Summary | None, count: Any,
                     most_tokens: int) -> list[dict[str, str]]:
    """Pure: the previous summary and the turns after it up to ``upto``, oldest lines dropped past
    ``most_tokens`` (the newest ones matter most: the previous summary already covers what came before)."""
    after = previous.upto_turn if previous is not None else -1
    lines = [f"User: {t.user}\nAssistant: {t.assistant}" for t in turns if after < t.turn <= upto]
    head = [f"Summary so far: {previous.summary}"] if previous is not None else []
    body = "\n".join(head + lines)
    while len(lines) > 1 and count(body) > most_tokens:
        lines.pop(0)
        body = "\n".join(head + lines)
    return [{"role": "system", "content": SUMMARY_INSTRUCTION}, {"role": "user", "content": body}]
