"""The fault suite's invariant checker, on made-up observations (it must catch what it claims to)."""
from __future__ import annotations

from infra.stores.conversations import Message
from tests.faults.invariants import Send, check_streams


def saved(gid: str, text: str, status: str = "complete") -> tuple[Message, Message]:
    return (Message("c", 0, "u1", "user", "hi"),
            Message("c", 0, gid, "assistant", text, status=status, parent_id="u1", generation_id=gid))


def test_a_clean_run_counts_every_send() -> None:
    sends = [Send("u", "c", 200, "g1", [(5, "Par"), (7, "is")], "end", longest_gap_s=0.4),
             Send("u", "c", 429)]
    counts = check_streams(sends, {"g1": saved("g1", "Paris")})
    assert counts.problems == []
    assert (counts.sends, counts.accepted, counts.saved_final, counts.text_equal) == (2, 1, 1, 1)
    assert counts.deltas == 2 and counts.longest_stall_s == 0.4


def test_each_broken_invariant_is_reported() -> None:
    sends = [Send("u", "c", 200, "lost"), Send("u", "c", 200, "stuck", [(1, "a")], "end"),
             Send("u", "c", 200, "short", [(1, "Par")], "end"),
             Send("u", "c", 200, "twice", [(3, "a"), (3, "a")], "end"),
             Send("u", "c", 200, "open", [(1, "a")], "")]
    counts = check_streams(sends, {"stuck": saved("stuck", "a", "generating"), "short": saved("short", "Paris"),
                                   "twice": saved("twice", "aa"), "open": saved("open", "a")})
    text = "\n".join(counts.problems)
    assert "lost: 2xx send without" in text and "stuck: assistant message still 'generating'" in text
    assert "short: streamed 3 chars != saved 5" in text and "twice: delta ids repeated" in text
    assert "open: the client's stream never ended" in text and counts.text_equal == 1
