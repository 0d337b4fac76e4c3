"""In-memory stand-ins for the stores, for unit tests of stage logic. Nothing here is used by the service.

Each keeps just enough behaviour to make the stage's decisions observable: ``FakeRedis`` honours ``nx``
and expiry-free keys, ``FakeQuota`` settles exactly once, ``FakeConversations`` keys messages by
(conversation, turn, message id) as Cassandra does.
"""
from __future__ import annotations

import dataclasses
import hashlib
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from infra.stores.conversations import Conversation, Message
from infra.stores.quota_outcomes import Reservation, Settled
from infra.stores.records import Summary
from schemas import Event
from schemas.codec import decode


class FakeRedis:
    def __init__(self) -> None:
        self.values: dict[str, bytes] = {}

    async def get(self, key: str) -> bytes | None:
        return self.values.get(key)

    async def mget(self, keys: list[str]) -> list[bytes | None]:
        return [self.values.get(k) for k in keys]

    async def set(self, key: str, value: Any, nx: bool = False, ex: int | None = None) -> bool:
        if nx and key in self.values:
            return False
        self.values[key] = str(value).encode()
        return True

    async def exists(self, key: str) -> int:
        return int(key in self.values)

    async def delete(self, key: str) -> int:
        return int(self.values.pop(key, None) is not None)


class FakeProducer:
    """Records what was produced, decoded: (topic, event, key)."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, Event, str]] = []

    async def send_and_wait(self, topic: str, value: bytes, key: bytes, partition: int | None = None) -> None:
        self.sent.append((topic, decode(value), key.decode()))


def settled_marker(generation_id: str, **changes: Any) -> Settled:
    values: dict[str, Any] = dict(
        generation_id=generation_id, user_id="u", plan="free", day="2026-12-01", conversation_id="c",
        reserved=600, tokens_in=10, tokens_out=5, tokens_cached=0, charged=15, status="complete", model="m",
        pool="large", started_at=1.0, finished_at=2.0, settled_at=3.0, published=False)
    values.update(changes)
    return Settled(**values)


@dataclass
class FakeQuota:
    """Reservations and settled markers; ``settle`` charges once and answers None after."""

    reservations: dict[str, Reservation] = field(default_factory=dict)
    markers: dict[str, Settled] = field(default_factory=dict)
    settle_calls: list[tuple[str, int, int, str]] = field(default_factory=list)
    release_calls: list[tuple[str, str]] = field(default_factory=list)
    forgotten: list[str] = field(default_factory=list)
    failures_left: int = 0  # settle raises this many times first (Redis unreachable)
    stale: set[str] = field(default_factory=set)  # ids left in the expiry set after their reservation went
    redis: FakeRedis = field(default_factory=FakeRedis)  # what settlement reads beside the quota (owner epochs)

    def reserve(self, generation_id: str, created_at: float = 100.0, prompt_tokens: int = 40) -> Reservation:
        r = Reservation(generation_id=generation_id, user_id="u", plan="free", day="2026-12-01", amount=552,
                        prompt_tokens=prompt_tokens, reply_cap=512, conversation_id="c", created_at=created_at,
                        expires_at=created_at + 300)
        self.reservations[generation_id] = r
        return r

    async def settle(self, generation_id: str, tokens_in: int, tokens_out: int, *, tokens_cached: int = 0,
                     status: str = "complete", model: str = "", pool: str = "", started_at: float = 0.0,
                     finished_at: float = 0.0, now: float | None = None, block_category: str = "",
                     rules_version: str = "") -> Settled | None:
        if self.failures_left:
            from redis.exceptions import ConnectionError as RedisConnectionError

            self.failures_left -= 1
            raise RedisConnectionError("redis is down")
        self.settle_calls.append((generation_id, tokens_in, tokens_out, status))
        reservation = self.reservations.pop(generation_id, None)
        if reservation is None:
            return None
        marker = settled_marker(generation_id, reserved=reservation.amount, tokens_in=tokens_in,
                                tokens_out=tokens_out, charged=tokens_in + tokens_out, status=status, model=model,
                                pool=pool, block_category=block_category, rules_version=rules_version)
        self.markers[generation_id] = marker
        return marker

    async def release(self, generation_id: str, reason: str, *, user_id: str = "", plan: str = "") -> int | None:
        """Give the whole reservation back, charging 0, once."""
        self.release_calls.append((generation_id, reason))
        reservation = self.reservations.pop(generation_id, None)
        if reservation is None or generation_id in self.markers:
            return None
        self.markers[generation_id] = settled_marker(generation_id, reserved=reservation.amount, tokens_in=0,
                                                     tokens_out=0, charged=0, status="failed", published=True)
        return reservation.amount

    async def settled(self, generation_id: str) -> Settled | None:
        return self.markers.get(generation_id)

    async def mark_published(self, generation_id: str) -> None:
        self.markers[generation_id] = dataclasses.replace(self.markers[generation_id], published=True)

    async def expired(self, now: float) -> list[str]:
        return [gid for gid, r in self.reservations.items() if r.expires_at <= now] + list(self.stale)

    async def reservation(self, generation_id: str) -> Reservation | None:
        return self.reservations.get(generation_id)

    async def forget_expired(self, generation_id: str) -> None:
        self.forgotten.append(generation_id)
        self.stale.discard(generation_id)

    async def unpublished(self, grace_s: float = 0.0, now: float | None = None) -> list[Settled]:
        return [m for m in self.markers.values() if not m.published]


class FakeConversations:
    def __init__(self, *conversations: Conversation) -> None:
        self.conversations = {c.conversation_id: c for c in conversations}
        self.messages: dict[tuple[str, int, str], Message] = {}
        self.touched: list[tuple[str, datetime, str | None]] = []
        self.listed_as_made: list[str] = []
        self.retitled: list[tuple[str, str]] = []
        self.reads = 0  # of a conversation's row
        self.taken_off: list[str] = []

    async def get(self, conversation_id: str) -> Conversation | None:
        self.reads += 1
        return self.conversations.get(conversation_id)

    async def list_where_made(self, conv: Conversation) -> None:
        self.listed_as_made.append(conv.conversation_id)

    async def take_off_list(self, user_id: str, conversation_id: str) -> None:
        self.taken_off.append(conversation_id)

    async def touch(self, conv: Conversation, at: datetime, title: str | None = None) -> Conversation:
        self.touched.append((conv.conversation_id, at, title))
        new = dataclasses.replace(conv, updated_at=max(at, conv.updated_at),
                                  title=title if title is not None else conv.title)
        self.conversations[conv.conversation_id] = new
        return new

    async def retitle(self, conv: Conversation, title: str) -> Conversation:
        self.retitled.append((conv.conversation_id, title))
        new = dataclasses.replace(self.conversations.get(conv.conversation_id, conv), title=title)
        self.conversations[conv.conversation_id] = new
        return dataclasses.replace(conv, title=title)

    async def save_message(self, message: Message) -> None:
        self.messages[(message.conversation_id, message.turn, message.message_id)] = message

    async def save_messages(self, messages: list[Message], placeholder_at_id_time: bool = False) -> None:
        for message in messages:
            await self.save_message(message)

    async def get_message(self, conversation_id: str, turn: int, message_id: str) -> Message | None:
        return self.messages.get((conversation_id, turn, message_id))

    async def all_messages(self, conversation_id: str) -> list[Message]:
        return [m for k, m in sorted(self.messages.items()) if k[0] == conversation_id]

    async def messages_of_turn(self, conversation_id: str, turn: int, message_ids: set[str]) -> dict[str, Message]:
        return {k[2]: m for k, m in self.messages.items() if k[:2] == (conversation_id, turn) and k[2] in message_ids}


class FakeRecords:
    def __init__(self) -> None:
        self.generations: dict[str, dict[str, Any]] = {}
        self.summaries: list[Summary] = []

    async def save_generation(self, **row: Any) -> None:
        self.generations[row["generation_id"]] = row

    async def save_summary(self, summary: Summary) -> None:
        self.summaries.append(summary)


def conversation(conversation_id: str = "c", user_id: str = "u", title: str | None = None) -> Conversation:
    return Conversation(conversation_id, user_id, title, None, datetime(2026, 12, 1, tzinfo=UTC))


class FakeDataKeys:
    """Which conversations have a data key (the gateway makes one before sealing a message)."""

    def __init__(self) -> None:
        self.live: set[str] = set()

    async def ensure(self, conversation_id: str, tenant_id: str) -> None:
        self.live.add(conversation_id)

    async def destroy(self, conversation_id: str) -> None:
        self.live.discard(conversation_id)


@dataclass
class FakeSealer:
    """Seals nothing (these tests are about routing, not encryption: tests/unit/test_sealing.py is)."""

    keys: FakeDataKeys = field(default_factory=FakeDataKeys)

    async def seal(self, event: Any) -> Any:
        return event

    def digest(self, user_id: str, *parts: str) -> str:
        return hashlib.sha256("\0".join((user_id, *parts)).encode()).hexdigest()[:32]

    async def seal_values(self, conversation_id: str, record: dict[str, Any], names: tuple[str, ...]) -> dict[str, Any]:
        return dict(record)

    async def open_values(self, conversation_id: str, record: dict[str, Any], names: tuple[str, ...]) -> dict[str, Any]:
        return dict(record)

    async def open(self, event: Any) -> Any:
        return event
