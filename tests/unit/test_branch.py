"""The branch a prompt is built from: parent links first, the old newest-finished-reply rule for rows
saved before user messages carried a parent."""
from __future__ import annotations

from consumers.prompt.branch import branch_turns, newest_reply
from infra.stores.conversations import Message


def msg(turn: int, mid: str, role: str, content: str, parent: str | None = None, status: str = "complete") -> Message:
    return Message("c", turn, mid, role, content, status=status, parent_id=parent)


def test_the_walk_follows_parents_and_ignores_sibling_branches() -> None:
    history = [msg(0, "u0", "user", "A"), msg(0, "r0", "assistant", "a", "u0"),
               msg(1, "u1", "user", "B", "r0"), msg(1, "r1", "assistant", "b", "u1"),
               msg(1, "u1x", "user", "B edited", "r0"), msg(1, "r1x", "assistant", "bx", "u1x")]
    asking = msg(2, "u2", "user", "C", "r1")
    assert [(t.user, t.assistant) for t in branch_turns(history, asking)] == [("A", "a"), ("B", "b"), ("C", None)]
    asking = msg(2, "u2", "user", "C", "r1x")
    assert [(t.user, t.assistant) for t in branch_turns(history, asking)] == [("A", "a"), ("B edited", "bx"),
                                                                               ("C", None)]


def test_rows_without_parents_use_the_newest_finished_reply_of_the_turn_before() -> None:
    history = [msg(0, "u0", "user", "A"), msg(0, "r0a", "assistant", "old", "u0"),
               msg(0, "r0b", "assistant", "new", "u0"), msg(0, "r0c", "assistant", "", "u0", status="failed"),
               msg(1, "u1", "user", "B")]
    turns = branch_turns(history, msg(2, "u2", "user", "C"))
    assert [(t.turn, t.user, t.assistant) for t in turns] == [(0, "A", "new"), (1, "B", ""), (2, "C", None)]


def test_an_unfinished_reply_on_the_branch_counts_as_empty_and_a_loop_ends_the_walk() -> None:
    history = [msg(0, "u0", "user", "A", "r0"), msg(0, "r0", "assistant", "half", "u0", status="generating")]
    assert [(t.user, t.assistant) for t in branch_turns(history, msg(1, "u1", "user", "B", "r0"))] == \
        [("A", ""), ("B", None)]
    assert newest_reply(history, excluding="r0") is None and newest_reply(history, "x").message_id == "r0"
