"""The one invariant checker every fault test ends with.

After a fault and the service's recovery it asserts, over every send the clients made during the test:
- every send that got a 2xx has its user message and an assistant message whose final status is one the
  fault expects (``complete`` or ``length`` by default: a fault that fails or stops its replies is caught);
- the text the client streamed equals the saved text (a stream that was cut and resumed included); a stream
  that ended on a snapshot of the saved reply is only checked for what it streamed before (a prefix), and
  counted apart, never as text equal;
- no delta was lost or repeated (the SSE ids a client saw are increasing, the chunks joined are the text);
- nothing stays reserved or running in Redis for the test's users;
- ``parley billing replay`` over the test's window, for the test's users, checked at least one user-day and
  reports 0 mismatches.
``Counts`` is what the report quotes per fault.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

FINAL = {"complete", "stopped", "length", "failed", "blocked"}
EXPECTED = frozenset({"complete", "length"})  # a reply that ran to its end or its cap


@dataclass
class Send:
    """What one client saw of one send: status, ids, and the stream (deltas with their SSE ids)."""

    user_id: str
    conversation_id: str
    status: int
    generation_id: str = ""
    deltas: list[tuple[int, str]] = field(default_factory=list)
    ended: str = ""  # stop_reason of message_end, "" if the stream never ended
    snapshot: str | None = None
    longest_gap_s: float = 0.0  # the client's longest wait between two events (keep-alives excluded)
    recovering: int = 0  # `recovering` events seen
    reasons: list[str] = field(default_factory=list)  # their reasons, in order

    @property
    def text(self) -> str:
        return self.snapshot if self.snapshot is not None else "".join(t for _, t in self.deltas)


@dataclass
class Counts:
    sends: int = 0
    accepted: int = 0
    saved_final: int = 0
    text_equal: int = 0
    snapshots: int = 0  # streams that ended on the saved reply's snapshot (their prefix checked)
    deltas: int = 0
    reserved_left: int = 0
    running_left: int = 0
    billing_checked: int = 0
    billing_mismatches: int = 0
    longest_stall_s: float = 0.0
    problems: list[str] = field(default_factory=list)


def check_streams(sends: list[Send], saved: dict[str, Any], expect: frozenset[str] = EXPECTED) -> Counts:
    """The pure part: ``saved`` maps generation id -> (user message, assistant message) as read back;
    ``expect``: the final statuses this fault may leave."""
    counts = Counts(sends=len(sends))
    for s in sends:
        if not 200 <= s.status < 300:
            continue
        counts.accepted += 1
        counts.deltas += len(s.deltas)
        counts.longest_stall_s = max(counts.longest_stall_s, s.longest_gap_s)
        ids = [i for i, _ in s.deltas]
        if ids != sorted(set(ids)):
            counts.problems.append(f"{s.generation_id}: delta ids repeated or out of order: {ids}")
        user, reply = saved.get(s.generation_id, (None, None))
        if user is None or reply is None:
            counts.problems.append(f"{s.generation_id}: 2xx send without its user and assistant messages")
            continue
        if reply.status not in FINAL:
            counts.problems.append(f"{s.generation_id}: assistant message still {reply.status!r}")
            continue
        counts.saved_final += 1
        if reply.status not in expect:
            counts.problems.append(f"{s.generation_id}: ended {reply.status!r}, expected one of {sorted(expect)}")
        if s.ended and s.snapshot is not None:
            streamed = "".join(t for _, t in s.deltas)
            if reply.content.startswith(streamed):
                counts.snapshots += 1
            else:
                counts.problems.append(f"{s.generation_id}: streamed {len(streamed)} chars before a snapshot, not "
                                       f"a prefix of the saved {len(reply.content)}")
        elif s.ended and s.text != reply.content:
            at = next((i for i, (a, b) in enumerate(zip(s.text, reply.content, strict=False)) if a != b),
                      min(len(s.text), len(reply.content)))
            counts.problems.append(f"{s.generation_id}: streamed {len(s.text)} chars != saved {len(reply.content)}, "
                                   f"first difference at char {at} of the joined deltas (ids {ids[:3]}..{ids[-3:]})")
            print(f"streamed: {s.text!r}\nsaved:    {reply.content!r}")  # the test's own text, never a log
        elif s.ended:
            counts.text_equal += 1
        else:
            counts.problems.append(f"{s.generation_id}: the client's stream never ended")
    return counts


async def check(sends: list[Send], *, settings: Any, db: Any, redis: Any, since: datetime,
                expect: frozenset[str] = EXPECTED) -> Counts:
    """Read the stores back and check everything; ``Counts.problems`` lists every broken invariant."""
    from datetime import UTC

    from infra.stores import keys
    from infra.stores.conversations import Conversations
    from infra.stores.records import Records
    from infra.stores.sealing import configured
    from streams.billing import replay

    conversations, saved = Conversations(db, configured(settings, db)), {}  # rows are sealed: opened to compare
    for conv in {s.conversation_id for s in sends}:
        messages = await conversations.all_messages(conv)
        for m in messages:
            if m.role == "assistant" and m.generation_id:
                user = next((u for u in messages if u.message_id == m.parent_id), None)
                saved[m.generation_id] = (user, m)
    counts = check_streams(sends, saved, expect)
    for user_id in {s.user_id for s in sends}:
        running = await redis.zcard(keys.quota_running(user_id))
        counts.running_left += running
    day = datetime.now(UTC).strftime("%Y-%m-%d")
    for user_id in {s.user_id for s in sends}:
        reserved = await redis.hget(keys.quota_day(user_id, day), "reserved")
        counts.reserved_left += int(reserved or 0)
    # This fault's users only: a mismatch an earlier fault left is that fault's failure, not this one's.
    mismatches, checked = await replay(settings, since, datetime.now(UTC), redis=redis, records=Records(db),
                                       users={s.user_id for s in sends})
    counts.billing_checked, counts.billing_mismatches = checked, len(mismatches)
    if counts.accepted and not checked:
        counts.problems.append("billing: the replay checked no user-day for this fault's users")
    if counts.running_left or counts.reserved_left:
        counts.problems.append(f"left in Redis: {counts.running_left} running, {counts.reserved_left} reserved")
    counts.problems += [f"billing: {m}" for m in mismatches]
    return counts
