"""Pure prompt fitting: shared system prompt first, then as many recent turns as fit the budget.

The system prompt is identical for every request so the engine's prefix cache shares
its KV blocks; the conversation's custom instructions come next (the same words on every
turn of it), then a summary of dropped turns, never inside either.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

SYSTEM_PROMPT = (
    "You are Parley, a helpful, honest assistant. Answer clearly and concisely. "
    "Use Markdown for lists and code."
)
PER_MESSAGE_OVERHEAD = 5  # a first guess at the chat template's tokens per message; fit_window measures
SUMMARY_MAX_GAP = 4  # a summary still stands in for the dropped turns when it misses at most this many
MIN_REPLY_TOKENS = 64  # room a lone long message must leave for its reply (or the reply cap, if smaller)
# Turns fall out in blocks: the oldest kept turn is a multiple of this, so it stays put for several prompts
# and the engine's prefix cache keeps serving the prompt's start (system, summary, oldest turns) instead of
# prefilling the whole window again on every turn. Costs up to DROP_STEP - 1 turns of context.
DROP_STEP = 4


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
        summary: tuple[int, str] | None = None, instructions: str | None = None,
        older: tuple[int, str] | None = None) -> Fitted:
    """``turns`` oldest first, the last one unanswered. Keeps newest turns whole while they fit; when older
    ones fall out and ``summary`` (upto_turn, text) covers them, its note gets room first, right after the
    shared system prompt and the conversation's ``instructions`` (always kept, and counted in the budget).

    ``older``: the summary before ``summary``. While ``summary`` also covers turns still kept (it was written
    ahead of the next drop), ``older`` stands in if it covers the fallen ones: the prompt's start, and so the
    engine's prefix cache, stays the same until that next drop."""
    told = instructions_note(instructions)
    base = count(SYSTEM_PROMPT) + PER_MESSAGE_OVERHEAD + (count(told) + PER_MESSAGE_OVERHEAD if told else 0)
    kept = _aligned(_newest(turns, count, budget - base), len(turns))
    dropped = turns[: len(turns) - len(kept)]
    if dropped and summary is not None:
        tried = [_with_note(turns, count, budget - base, s) for s in (summary, older) if s is not None]
        usable = [(s, w, d, note) for s, (w, d, note, fits) in zip((summary, older), tried, strict=False)
                  if s is not None and fits and s[0] >= d[-1].turn - SUMMARY_MAX_GAP]
        exact = [u for u in usable if u[0][0] <= u[2][-1].turn]  # covers no kept turn
        if usable:
            _, with_note, dropped_too, note = (exact or usable)[0]
            return _fitted(with_note, dropped_too, note, told)
    return _fitted(kept, dropped, None, told)


def _with_note(turns: Sequence[Turn], count: Callable[[str], int], room: int,
               summary: tuple[int, str]) -> tuple[list[Turn], Sequence[Turn], str, bool]:
    """(Kept turns, fallen turns, the note, whether it all fits) with ``summary``'s note given room first."""
    note = f"Summary of the earlier conversation: {summary[1]}"
    with_note = _aligned(_newest(turns, count, room - count(note) - PER_MESSAGE_OVERHEAD), len(turns))
    dropped_too = turns[: len(turns) - len(with_note)]
    fits = sum(_cost(t, count) for t in with_note) + count(note) + PER_MESSAGE_OVERHEAD <= room
    return with_note, dropped_too, note, fits and bool(dropped_too)


def _newest(turns: Sequence[Turn], count: Callable[[str], int], room: int) -> list[Turn]:
    """The newest turns whose cost fits ``room``; the current turn always (the builder checks the window)."""
    used, kept = 0, list[Turn]()
    for t in reversed(turns):
        cost = _cost(t, count)
        if kept and used + cost > room:
            break
        kept.append(t)
        used += cost
    kept.reverse()
    return kept


def _aligned(kept: list[Turn], total: int) -> list[Turn]:
    """``kept`` from the next turn number that is a multiple of DROP_STEP (the current turn always stays)."""
    if len(kept) == total:
        return kept  # nothing fell out: nothing to align
    start = -(-kept[0].turn // DROP_STEP) * DROP_STEP
    return [t for t in kept if t.turn >= start] or kept[-1:]


def instructions_note(instructions: str | None) -> str | None:
    return f"The user's custom instructions, to follow in this conversation:\n{instructions}" if instructions else None


def _fitted(kept: list[Turn], dropped: Sequence[Turn], note: str | None, told: str | None = None) -> Fitted:
    messages = [{"role": "system", "content": SYSTEM_PROMPT}]
    if told is not None:
        messages.append({"role": "system", "content": told})
    if note is not None:
        messages.append({"role": "system", "content": note})
    for t in kept:
        messages.append({"role": "user", "content": t.user})
        if t.assistant is not None:
            messages.append({"role": "assistant", "content": t.assistant})
    return Fitted(messages, len(kept), dropped[-1].turn if dropped else None, note is not None)


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


@dataclass(frozen=True)
class Window:
    """A prompt that fits one pool: its token ids, the reply it leaves room for, and what it kept."""

    ids: list[int]
    max_tokens: int
    fitted: Fitted


@dataclass(frozen=True)
class TooLong:
    """The new message alone, with the instructions, leaves no room for a reply."""

    tokens: int
    most: int  # the longest prompt this pool would take


def fit_window(fit_at: Callable[[int], Fitted], render: Callable[[list[dict[str, str]]], list[int]],
               budget: int, context: int, reply_cap: int) -> Window | TooLong:
    """Fit to min(budget, context - reply_cap) as the model's own tokenizer renders it, template included.

    ``fit_at(b)`` fits with the per-message estimate; the rendered prompt is then measured, and while it is
    still over, the estimate's budget shrinks by the excess (older turns and the summary go first). Only the
    new message by itself may run over, and then only into the reply's room down to MIN_REPLY_TOKENS.
    """
    limit = min(budget, context - reply_cap)
    b = limit
    while True:
        fitted = fit_at(b)
        ids = render(fitted.messages)
        over = len(ids) - limit
        if over <= 0 or (fitted.turns_kept <= 1 and not fitted.summary_used) or b <= 0:
            break
        b -= over
    room = context - len(ids)
    if room >= reply_cap:
        return Window(ids, reply_cap, fitted)
    if room >= min(reply_cap, MIN_REPLY_TOKENS):
        return Window(ids, room, fitted)
    return TooLong(len(ids), context - min(reply_cap, MIN_REPLY_TOKENS))
