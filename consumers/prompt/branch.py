"""Which earlier turns a prompt is built from: the branch of the conversation being answered.

A conversation is a tree. A reply's ``parent_id`` is the user message it answers; a user message's
``parent_id`` is the reply it follows (None on the first turn). Regenerated replies and edited user
messages are siblings: same turn, same parent. Walking ``parent_id`` up from the message being
answered gives exactly the turns the person sees above it, whatever other branches exist.

Messages saved before user messages carried a parent have none past the first turn; for those the
walk falls back to the newest finished reply of the turn before, which is what every prompt used then.
"""
from __future__ import annotations

from consumers.prompt.fit import Turn
from infra.stores.conversations import Message

FINISHED = ("complete", "stopped", "length")


def newest_reply(history: list[Message], excluding: str) -> Message | None:
    """The reply made last (ids are time-ordered): where a message that names no branch continues."""
    replies = [m for m in history if m.role == "assistant" and m.message_id != excluding]
    return max(replies, key=lambda m: m.message_id, default=None)


def branch_turns(history: list[Message], answering: Message) -> list[Turn]:
    """(user, reply) pairs from the first turn down to ``answering``, which ends the list unanswered."""
    by_id = {m.message_id: m for m in history}
    turns = [Turn(answering.turn, answering.content, None)]
    after, turn, seen = answering.parent_id, answering.turn, {answering.message_id}
    while turn > 0:
        reply = by_id.get(after) if after else _older_reply(history, turn - 1)
        user = by_id.get(reply.parent_id or "") if reply is not None else _older_user(history, turn - 1)
        if user is None or user.message_id in seen or user.turn >= turn:
            break  # a broken or looping chain: keep what was found
        seen.add(user.message_id)
        text = reply.content if reply is not None and reply.status in FINISHED else ""
        if user.status != "blocked":  # a refused message is not part of what the model reads
            turns.append(Turn(user.turn, user.content, text))
        after, turn = user.parent_id, user.turn
    return turns[::-1]


def _older_reply(history: list[Message], turn: int) -> Message | None:
    at_turn = [m for m in history if m.role == "assistant" and m.turn == turn]
    finished = [m for m in at_turn if m.status in FINISHED]
    return max(finished or at_turn, key=lambda m: m.message_id, default=None)


def _older_user(history: list[Message], turn: int) -> Message | None:
    return max((m for m in history if m.role == "user" and m.turn == turn), key=lambda m: m.message_id, default=None)
