"""A conversation as people read it: the branch on screen, as JSON or Markdown (export and share).

Pure functions of the stored messages. A conversation is a tree (regenerated replies and edited
messages are siblings); what is exported or shared is one branch: the one ending at a message the
client names (the last one on its screen), else the one the page shows by default, the newest
sibling at every turn.
"""
from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Any

from infra.stores.conversations import Message

ROLE_NAMES = {"user": "You", "assistant": "Parley"}


def _newest(messages: list[Message]) -> Message | None:
    return max(messages, key=lambda m: m.message_id, default=None)  # ids are time-ordered


def _parent_of(user: Message, replies: list[Message]) -> str | None:
    """A user message's parent; messages saved before users carried one follow the newest reply before."""
    if user.parent_id is not None or user.turn <= 0:
        return user.parent_id
    before = _newest([r for r in replies if r.turn == user.turn - 1])
    return before.message_id if before else None


def branch(messages: list[Message], last_id: str | None = None) -> list[Message]:
    """The messages of one branch, first turn first: up to ``last_id`` if given, else the newest one."""
    if last_id is not None:
        return _up_to(messages, last_id)
    users = [m for m in messages if m.role == "user"]
    replies = [m for m in messages if m.role == "assistant"]
    out: list[Message] = []
    parent: str | None = None
    seen: set[str | None] = set()
    while parent not in seen:
        seen.add(parent)
        user = _newest([u for u in users if _parent_of(u, replies) == parent])
        if user is None:
            break
        out.append(user)
        reply = _newest([r for r in replies if r.parent_id == user.message_id])
        if reply is None:
            break
        out.append(reply)
        parent = reply.message_id
    return out


def _up_to(messages: list[Message], last_id: str) -> list[Message]:
    by_id = {m.message_id: m for m in messages}
    replies = [m for m in messages if m.role == "assistant"]
    m, out = by_id.get(last_id), []
    while m is not None and m not in out:
        out.append(m)
        parent = m.parent_id if m.role == "assistant" else _parent_of(m, replies)
        m = by_id.get(parent) if parent else None
    return out[::-1]


def iso(ts: datetime | None) -> str | None:
    if ts is None:
        return None
    return (ts if ts.tzinfo else ts.replace(tzinfo=UTC)).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def message_json(m: Message) -> dict[str, Any]:
    """What a reader of the transcript needs: no generation, pool or usage bookkeeping."""
    return {"message_id": m.message_id, "parent_id": m.parent_id, "turn": m.turn, "role": m.role,
            "content": m.content, "status": m.status, "model": m.model, "created_at": iso(m.created_at),
            "finished_at": iso(m.finished_at)}


def markdown(title: str | None, model: str | None, messages: list[Message], exported_at: datetime) -> str:
    """One heading per message; the messages' own Markdown below it, as written."""
    lines = [f"# {_one_line(title) or 'Untitled conversation'}", "",
             f"_Exported from Parley on {iso(exported_at)}" + (f", model {model}_" if model else "_"), ""]
    for m in messages:
        who = ROLE_NAMES.get(m.role, m.role)
        if m.role == "assistant" and m.model:
            who += f" ({m.model})"
        when = f" · {iso(m.created_at)}" if m.created_at else ""
        status = f" · {m.status}" if m.status not in ("complete", "") else ""
        lines += [f"## {who}{when}{status}", "", m.content.rstrip(), ""]
    return "\n".join(lines)


def _one_line(text: str | None) -> str:
    return " ".join((text or "").split())


def filename(title: str | None, extension: str) -> str:
    """An ASCII file name from the title, safe in a Content-Disposition header."""
    slug = re.sub(r"[^A-Za-z0-9]+", "-", _one_line(title)).strip("-").lower()[:60]
    return f"parley-{slug or 'conversation'}.{extension}"
