"""What one gateway process holds: clients of Kafka, Redis and Cassandra, and the token relay.

Nothing here is state another gateway could not rebuild: ownership and reader
heartbeats live in Redis, messages in Cassandra, tokens in Kafka.
"""
from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import redis.asyncio as aioredis
from aiokafka import AIOKafkaProducer

from infra.config.settings import Settings
from infra.stores import keys
from infra.stores.accounts import Accounts, User
from infra.stores.conversations import Conversations
from infra.stores.records import Records
from infra.stores.session import AsyncSession, connect
from producers.gateway.cursors import Cursors, cursor_key
from producers.gateway.relay import TokenRelay
from topics import Role, Topics
from topics.catalogue import CONTROL, GATEWAY, REQUESTS, TOKENS
from topics.clients import make_producer

OWNER_TTL_S = 7 * 24 * 3600
# The gateway reads chat.tokens by assigning partitions (relay.py), without a group.
ROLE = Role(GATEWAY, reads=(TOKENS,), writes=(REQUESTS, CONTROL))


@dataclass
class Gateway:
    settings: Settings
    models: dict[str, str]  # pool -> served model name
    gateway_id: str = field(default_factory=lambda: f"gw-{uuid.uuid4().hex[:8]}")
    keepalive_s: float = 10.0
    topics: Topics = field(init=False)
    producer: AIOKafkaProducer = field(init=False)
    relay: TokenRelay = field(init=False)
    redis: aioredis.Redis = field(init=False)
    accounts: Accounts = field(init=False)
    conversations: Conversations = field(init=False)
    records: Records = field(init=False)
    cursors: Cursors = field(init=False)
    quota: Any = None
    _cluster: Any = None
    _auth_cache: dict[str, tuple[float, User]] = field(default_factory=dict)

    async def start(self) -> None:
        self.cursors = Cursors(cursor_key(self.settings))
        self.topics = Topics(self.settings.topic_prefix)
        self.producer = make_producer(self.settings.kafka_bootstrap)
        await self.producer.start()
        self.relay = TokenRelay(self.settings.kafka_bootstrap, self.topics.tokens)
        await self.relay.start()
        self.redis = aioredis.Redis.from_url(self.settings.redis_url)
        self._cluster, session = connect(self.settings)
        db = AsyncSession(session)
        self.accounts, self.conversations, self.records = Accounts(db), Conversations(db), Records(db)

    async def stop(self) -> None:
        await self.relay.stop()
        await self.producer.stop()
        await self.redis.aclose()
        if self._cluster is not None:
            self._cluster.shutdown()

    async def user_for_token(self, token: str) -> User | None:
        cached = self._auth_cache.get(token)
        if cached and cached[0] > time.monotonic():
            return cached[1]
        user = await self.accounts.user_for_token(token)
        if user is not None:
            self._auth_cache[token] = (time.monotonic() + 60, user)
        return user

    async def owner(self, generation_id: str) -> tuple[str, str] | None:
        raw = await self.redis.get(keys.generation_owner(generation_id))
        if raw is None:
            row = await self.records.get_generation(generation_id)
            return (row.user_id, row.conversation_id) if row is not None else None  # type: ignore[attr-defined]
        user_id, conversation_id = raw.decode().split(" ", 1)
        return user_id, conversation_id

    async def claim(self, generation_id: str, user_id: str, conversation_id: str) -> None:
        """Owner and first reader heartbeat of a new generation, in one round trip."""
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.set(keys.generation_owner(generation_id), f"{user_id} {conversation_id}", ex=OWNER_TTL_S)
            pipe.set(keys.reader_heartbeat(generation_id), self.gateway_id, ex=self._reader_ttl_s)
            await pipe.execute()

    async def worker_alive(self, worker_id: str) -> bool:
        return bool(await self.redis.exists(keys.worker_alive(worker_id)))

    async def reader_beat(self, generation_id: str) -> None:
        await self.redis.set(keys.reader_heartbeat(generation_id), self.gateway_id, ex=self._reader_ttl_s)

    @property
    def _reader_ttl_s(self) -> int:
        return max(1, int(self.settings.reader_timeout_s))
