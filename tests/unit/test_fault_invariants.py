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


def test_a_reply_ended_other_than_expected_is_a_problem() -> None:
    sends = [Send("u", "c", 200, "f", [(1, "a")], "error"), Send("u", "c", 200, "s", [(1, "a")], "stopped")]
    counts = check_streams(sends, {"f": saved("f", "a", "failed"), "s": saved("s", "a", "stopped")})
    text = "\n".join(counts.problems)
    assert "f: ended 'failed'" in text and "s: ended 'stopped'" in text
    assert not check_streams(sends[1:], {"s": saved("s", "a", "stopped")}, frozenset({"stopped"})).problems


def test_a_snapshot_is_not_counted_as_text_equal_and_its_prefix_is_checked() -> None:
    good = Send("u", "c", 200, "g", [(1, "Pa")], "end", snapshot="Paris")
    bad = Send("u", "c", 200, "b", [(1, "Lo")], "end", snapshot="Paris")
    counts = check_streams([good, bad], {"g": saved("g", "Paris"), "b": saved("b", "Paris")})
    assert counts.text_equal == 0 and counts.snapshots == 1
    assert counts.problems == ["b: streamed 2 chars before a snapshot, not a prefix of the saved 5"]
