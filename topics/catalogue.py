"""Every topic of the pipeline, declared once: name, key, events, partitions,
retention, cleanup policy, who produces it and which consumer groups read it.

Stage code never spells a topic name; it asks this module (``Topics(prefix)``).
"""
from __future__ import annotations

from dataclasses import dataclass

from schemas import (
    CancelRequested,
    ConversationDeleted,
    ConversationPurged,
    Event,
    EventDeadLettered,
    GenerationFinished,
    GenerationQueued,
    GenerationRequested,
    GenerationStarted,
    MessageSubmitted,
    PromptBuilt,
    RequestAdmitted,
    RequestRefused,
    TokensAppended,
    UsageRecorded,
)

MINUTE_MS = 60_000
HOUR_MS = 60 * MINUTE_MS
DAY_MS = 24 * HOUR_MS

POOLS = ("large", "small")
LANES = ("paid", "free")


@dataclass(frozen=True)
class Topic:
    name: str
    key: str
    events: tuple[type[Event], ...]
    partitions: int
    retention_ms: int
    producers: tuple[str, ...]
    consumer_groups: tuple[str, ...]
    cleanup_policy: str = "delete"

    @property
    def config(self) -> dict[str, str]:
        return {"retention.ms": str(self.retention_ms), "cleanup.policy": self.cleanup_policy}


def _catalogue() -> tuple[Topic, ...]:
    fixed = (
        Topic("chat.requests", "user_id", (MessageSubmitted,), 6, 7 * DAY_MS,
              ("gateway",), ("admission",)),
        Topic("chat.admitted", "conversation_id", (RequestAdmitted,), 6, 7 * DAY_MS,
              ("admission",), ("prompt",)),
        Topic("chat.prompts", "conversation_id", (PromptBuilt,), 6, 7 * DAY_MS,
              ("prompt",), ("scheduler",)),
        # The token buffer: 10 minutes, the seed's TTL. Readers find a generation's
        # partition from its key, so the SSE event id can be the bare offset.
        Topic("chat.tokens", "generation_id",
              (RequestRefused, GenerationQueued, GenerationStarted, TokensAppended, GenerationFinished),
              6, 10 * MINUTE_MS, ("admission", "scheduler", "worker"), ("gateway (assigned, no group)",)),
        Topic("chat.replies", "conversation_id", (GenerationFinished,), 6, 7 * DAY_MS,
              ("worker",), ("settlement", "persistence", "scheduler")),
        # Broadcast: every worker reads every partition without a group.
        Topic("chat.control", "generation_id", (CancelRequested,), 1, 1 * HOUR_MS,
              ("gateway", "scheduler"), ("worker (assigned, no group)",)),
        Topic("usage", "user_id", (UsageRecorded,), 6, 30 * DAY_MS,
              ("settlement",), ("usage-rollup", "billing")),
        # Deletions: the purge stage removes what the conversation left behind; the audit keeps a year of
        # what was removed (ids and counts, never text).
        Topic("chat.deletions", "conversation_id", (ConversationDeleted,), 3, 7 * DAY_MS,
              ("gateway", "retention"), ("purge",)),
        Topic("audit.purges", "conversation_id", (ConversationPurged,), 1, 365 * DAY_MS,
              ("purge",), ()),
        Topic("chat.deadletter", "source topic", (EventDeadLettered,), 1, 14 * DAY_MS,
              ("every consumer",), ()),
    )
    lanes = tuple(
        Topic(generate_topic_name(pool, lane), "conversation_id", (GenerationRequested,), 4, 7 * DAY_MS,
              ("scheduler",), (f"worker.{pool}",))
        for pool in POOLS for lane in LANES
    )
    return fixed + lanes


def generate_topic_name(pool: str, lane: str) -> str:
    return f"generate.{pool}.{lane}"


CATALOGUE: tuple[Topic, ...] = _catalogue()
BY_NAME: dict[str, Topic] = {t.name: t for t in CATALOGUE}


class Topics:
    """Topic names as one deployment sees them (tests isolate themselves with a prefix)."""

    def __init__(self, prefix: str = "") -> None:
        self.prefix = prefix
        self.requests = self._n("chat.requests")
        self.admitted = self._n("chat.admitted")
        self.prompts = self._n("chat.prompts")
        self.tokens = self._n("chat.tokens")
        self.replies = self._n("chat.replies")
        self.control = self._n("chat.control")
        self.usage = self._n("usage")
        self.deadletter = self._n("chat.deadletter")
        self.deletions = self._n("chat.deletions")
        self.purges = self._n("audit.purges")

    def _n(self, name: str) -> str:
        return f"{self.prefix}{name}"

    def generate(self, pool: str, lane: str) -> str:
        return self._n(generate_topic_name(pool, lane))

    def all(self) -> list[tuple[str, Topic]]:
        return [(self._n(t.name), t) for t in CATALOGUE]
