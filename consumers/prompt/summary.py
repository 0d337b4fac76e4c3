"""Rolling summaries of the turns that no longer fit: what to ask the small pool, and when.

A request covers the previous summary plus the turns dropped since, so each summary
carries everything before it. One is in flight per conversation at a time (a Redis
``SET NX`` that persistence clears when the summary is saved); a new one is asked
for once the stored one misses more than one dropped turn, and, once turns have fallen out, ahead of the next
block's fall (``ahead``), so the next drop finds its summary written.
"""
from __future__ import annotations

from typing import Any

from consumers.prompt.fit import DROP_STEP, Turn
from infra.stores.records import Summary

SUMMARY_INSTRUCTION = "Summarise this conversation in at most five sentences, keeping names, numbers and decisions."
SUMMARY_MAX_TOKENS = 160
IN_FLIGHT_S = 60  # a summary lost on the way (a worker died) blocks the next one for at most this long


def wanted(dropped_upto: int | None, summary: Summary | None) -> bool:
    """Pure: whether the dropped turns need a (newer) summary."""
    if dropped_upto is None:
        return False
    return summary is None or summary.upto_turn < dropped_upto - 1


def ahead(turns: list[Turn], turns_kept: int, newest: int | None) -> int | None:
    """Pure: the turn a summary should cover now so that it is written before the next prompt drops its oldest
    block of kept turns, or None. The engine's prefix cache holds a prompt's start (system prompt, summary,
    oldest turns), which changes when a block falls out; a summary asked for only then is written while the
    next turn is answered, and the turn after changes the start again: two full prefills per block instead of
    one. So once turns have fallen out, the block that falls next (from the oldest kept turn to the next
    multiple of DROP_STEP) is summarised at once, a block's worth of turns before it falls: a conversation
    that goes on drops it, and the summary is the one it would have asked for then. Only answered turns, and
    only a block the newest stored summary (``newest``: its last turn) does not cover yet."""
    if turns_kept < 2 or turns_kept > len(turns):
        return None
    oldest = turns[-turns_kept].turn
    upto = (oldest // DROP_STEP + 1) * DROP_STEP - 1
    if upto >= turns[-1].turn or (newest is not None and newest >= upto):
        return None
    return upto


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
