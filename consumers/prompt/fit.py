"""Pure prompt fitting: shared system prompt first, then as many recent turns as fit the budget.

The system prompt is identical for every request so the engine's prefix cache shares
its KV blocks; a summary of dropped turns goes after it, never inside it.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

SYSTEM_PROMPT = (
    "You are Parley, a helpful, honest assistant. Answer clearly and concisely. "
    "Use Markdown for lists and code."
)
PER_MESSAGE_OVERHEAD = 5  # role markers and separators the chat template adds around each message


@dataclass(frozen=True)
class Turn:
    turn: int
    user: str
    assistant: str | None  # None for the turn being answered now


@dataclass(frozen=True)
class Fitted:
    messages: list[dict[str, str]]
    turns_kept: int
    dropped_upto_turn: int | None  # the last turn that fell out, if any
    summary_used: bool


def fit(turns: Sequence[Turn], count: Callable[[str], int], budget: int,
        summary: tuple[int, str] | None = None) -> Fitted:
    """``turns`` oldest first, the last one unanswered. Keeps newest turns whole while they fit."""
    used = count(SYSTEM_PROMPT) + PER_MESSAGE_OVERHEAD
    kept: list[Turn] = []
    for t in reversed(turns):
        cost = _cost(t, count)
        if kept and used + cost > budget:  # the current turn is always kept; the builder checks context
            break
        kept.append(t)
        used += cost
    kept.reverse()
    dropped = turns[: len(turns) - len(kept)]
    messages = [{"role": "system", "content": SYSTEM_PROMPT}]
    summary_used = False
    if dropped and summary is not None and summary[0] >= dropped[-1].turn - 1:
        note = f"Summary of the earlier conversation: {summary[1]}"
        if used + count(note) + PER_MESSAGE_OVERHEAD <= budget:
            messages.append({"role": "system", "content": note})
            summary_used = True
    for t in kept:
        messages.append({"role": "user", "content": t.user})
        if t.assistant is not None:
            messages.append({"role": "assistant", "content": t.assistant})
    return Fitted(messages, len(kept), dropped[-1].turn if dropped else None, summary_used)


def _cost(t: Turn, count: Callable[[str], int]) -> int:
    cost = count(t.user) + PER_MESSAGE_OVERHEAD
    if t.assistant is not None:
        cost += count(t.assistant) + PER_MESSAGE_OVERHEAD
    return cost


def fit_history(messages: Sequence[tuple[str, str]], count: Callable[[str], int], budget: int) -> Fitted:
    """A client-supplied history: the client's own system messages (Parley's shared one only when the
    client sent none: an API client's instructions replace it), then the newest other messages that fit
    (the last one, the question, always)."""
    system = [c for r, c in messages if r == "system"] or [SYSTEM_PROMPT]
    rest = [(r, c) for r, c in messages if r != "system"]
    used = sum(count(c) + PER_MESSAGE_OVERHEAD for c in system)
    kept: list[tuple[str, str]] = []
    for role, content in reversed(rest):
        cost = count(content) + PER_MESSAGE_OVERHEAD
        if kept and used + cost > budget:
            break
        kept.append((role, content))
        used += cost
    kept.reverse()
    out = [{"role": "system", "content": c} for c in system] + [{"role": r, "content": c} for r, c in kept]
    dropped = len(rest) - len(kept)
    return Fitted(out, len(kept), dropped - 1 if dropped else None, False)
