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

from infra.config.plans import Plan, load_plans
from infra.config.settings import Settings
from infra.stores import keys
from infra.stores.accounts import Accounts, User
from infra.stores.conversations import Conversations
from infra.stores.finished import FinishedReplies
from infra.stores.page_sessions import PageSessions
from infra.stores.preferences import Preferences
from infra.stores.records import Records
from infra.stores.sealing import Sealer, configured
from infra.stores.search import SearchIndex
from infra.stores.session import AsyncSession, connect
from producers.gateway import metrics
from producers.gateway.cursors import Cursors, cursor_key
from producers.gateway.owners import Owners
from producers.gateway.relay import TokenRelay
from producers.gateway.stream_slots import StreamSlots
from producers.gateway.tokens import TokenCache
from topics import Role, Topics
from topics.catalogue import CONTROL, DELETIONS, GATEWAY, REQUESTS, TOKENS
from topics.clients import make_producer

OWNER_TTL_S = 7 * 24 * 3600
# The gateway reads chat.tokens by assigning partitions (relay.py, tails.py), without a group: its own share
# (gateway i of N: p % N == i), and another's only while a stream here follows a generation there.
ROLE = Role(GATEWAY, reads=(TOKENS,), writes=(REQUESTS, CONTROL, DELETIONS))


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
    tokens: TokenCache = field(init=False)
    conversations: Conversations = field(init=False)
    conversation_owners: Owners = field(init=False)
    records: Records = field(init=False)
    finished: FinishedReplies = field(init=False)
    cursors: Cursors = field(init=False)
    sessions: PageSessions = field(init=False)
    search: SearchIndex = field(init=False)
    preferences: Preferences = field(init=False)
    sealer: Sealer = field(init=False)
    plans: dict[str, Plan] = field(default_factory=dict)  # read at start(), from settings.plans_file
    quota: Any = None
    _cluster: Any = None
    _auth_cache: dict[str, tuple[float, User]] = field(default_factory=dict)
    streams: StreamSlots = field(init=False)  # open replies and resumes per user on this gateway

    def __post_init__(self) -> None:
        self.streams = StreamSlots(self.settings.max_streams_per_user, self.settings.max_streams_per_gateway)

    async def start(self) -> None:
        self.cursors = Cursors(cursor_key(self.settings))
        self.plans = self.plans or load_plans(self.settings.plans_file)
        metrics.declare(list(self.plans), list(self.models))
        self.topics = Topics(self.settings.topic_prefix)
        self.producer = make_producer(self.settings.kafka_bootstrap)
        await self.producer.start()
        self.redis = aioredis.Redis.from_url(self.settings.redis_url)
        self._cluster, session = connect(self.settings)
        db = AsyncSession(session)
        self.sealer = configured(self.settings, db, self.redis)
        self.accounts = Accounts(db, self.settings.token_ttl_days)
        self.tokens = TokenCache(self.accounts, self.redis)
        self.tokens.start()
        self.conversations, self.records = Conversations(db, self.sealer), Records(db, self.sealer)
        self.conversation_owners = Owners(self.conversations, self.sealer.keys)
        self.sealer.keys.start()  # heard from the first request on, so its owner and key can be kept
        self.finished = FinishedReplies(self.redis, sealer=self.sealer)
        self.relay = TokenRelay(self.settings.kafka_bootstrap, self.topics.tokens, self.sealer,
                                index=self.settings.gateway_index, count=self.settings.gateway_count)
        await self.relay.start()
        self.sessions = PageSessions(self.redis, self.settings.session_ttl_s)
        self.search = SearchIndex(db, self.conversations)
        self.preferences = Preferences(db, self.sealer)

    async def stop(self) -> None:
        await self.tokens.stop()
        await self.relay.stop()
        await self.producer.stop()
        await self.redis.aclose()
        if self._cluster is not None:
            self._cluster.shutdown()

    def new_generation_id(self) -> str:
        """An id for a reply this gateway starts: its token records land on a partition this gateway tails."""
        return self.relay.new_generation_id()

    async def user_for_token(self, token: str) -> User | None:
        """The live token's user; cached, and dropped on every gateway the moment it is revoked (tokens.py)."""
        return await self.tokens.user(token)

    async def user_for_session(self, session_id: str) -> User | None:
        """The page's signed-in user. The session is looked up every time: sign-out ends it at once."""
        user_id = await self.sessions.user_id(session_id)
        if user_id is None:
            return None
        cached = self._auth_cache.get(f"user:{user_id}")
        if cached and cached[0] > time.monotonic():
            return cached[1]
        user = await self.accounts.get_user(user_id)
        if user is not None:
            self._auth_cache[f"user:{user_id}"] = (time.monotonic() + 60, user)
        return user

    async def owner(self, generation_id: str) -> tuple[str, str] | None:
        raw = await self.redis.get(keys.generation_owner(generation_id))
        if raw is None:  # a delete removes the owner key; the saved row must belong to a live conversation
            row: Any = await self.records.get_generation(generation_id)
            if row is None or await self.conversations.get(row.conversation_id) is None:
                return None
            return row.user_id, row.conversation_id
        user_id, conversation_id = raw.decode().split(" ", 1)
        return user_id, conversation_id

    async def claim(self, generation_id: str, user_id: str, conversation_id: str) -> int:
        """Owner and first reader heartbeat of a new generation, in one round trip; the number of generations
        the conversation has had (kept while a reply's owner is: 1 is its first, on any gateway)."""
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.set(keys.generation_owner(generation_id), f"{user_id} {conversation_id}", ex=OWNER_TTL_S)
            pipe.set(keys.reader_heartbeat(generation_id), self.gateway_id, ex=self._reader_ttl_s)
            pipe.sadd(keys.conversation_generations(conversation_id), generation_id)  # what a delete cancels
            pipe.expire(keys.conversation_generations(conversation_id), OWNER_TTL_S)
            pipe.scard(keys.conversation_generations(conversation_id))
            return int((await pipe.execute())[-1])

    async def worker_alive(self, worker_id: str) -> bool:
        return bool(await self.redis.exists(keys.worker_alive(worker_id)))

    def kafka_quiet_s(self) -> float | None:
        """Seconds since Kafka last answered this gateway's own tail (None: not known yet)."""
        return self.relay.tail.quiet_s()
    def keeps_nothing(self, user: User) -> bool:
        plan = self.plans.get(user.plan)
        return plan is not None and plan.no_retention

    async def reader_beat(self, generation_id: str) -> None:
        await self.redis.set(keys.reader_heartbeat(generation_id), self.gateway_id, ex=self._reader_ttl_s)

    @property
    def _reader_ttl_s(self) -> int:
        return max(1, int(self.settings.reader_timeout_s))
