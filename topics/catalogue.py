"""Every topic of the pipeline, declared once: name, key, events, partitions, retention, cleanup policy,
which stages produce it and which read it; and every stage (consumer group) name.

Each name is written here once. Stage code never spells a topic or group name: it asks ``Topics(prefix,
pools)`` for the names one deployment sees. The ``generate.<pool>.<lane>`` topics are derived from the pools
the caller passes (``infra/config/pools.toml``; this package does not read configuration) and the lanes of
``schemas.scheduler.LANES``. Each stage module declares its ``ROLE`` (what it reads and writes, by reference
to the objects here); a unit test checks those declarations, the columns below and the code against each other.
"""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace

from schemas import (
    CancelRequested,
    ConversationDeleted,
    ConversationPurged,
    Event,
    EventDeadLettered,
    GenerationFinished,
    GenerationQueued,
    GenerationRequested,
    GenerationRetracted,
    GenerationStarted,
    InputBlocked,
    MessageSubmitted,
    PromptBuilt,
    RequestAdmitted,
    RequestRefused,
    TokensAppended,
    UsageRecorded,
)
from schemas.scheduler import LANES

MINUTE_MS = 60_000
HOUR_MS = 60 * MINUTE_MS
DAY_MS = 24 * HOUR_MS

# Stages: each name is the stage's consumer group (or faust app id), its log name and its ``parley stages --only``
# name. The generation stage has one group per pool (``generation.<pool>``).
GATEWAY = "gateway"
ADMISSION = "admission"
PROMPT = "prompt"
SCHEDULER = "scheduler"
GENERATION = "generation"
SETTLEMENT = "settlement"
PERSISTENCE = "persistence"
REAPER = "reaper"
USAGE_ROLLUP = "usage-rollup"
ABANDONED = "abandoned"
BILLING = "billing"
PURGE = "purge"
RETENTION = "retention"
STAGES = (GATEWAY, ADMISSION, PROMPT, SCHEDULER, GENERATION, SETTLEMENT, PERSISTENCE, REAPER, USAGE_ROLLUP,
          ABANDONED, BILLING, PURGE, RETENTION)


@dataclass(frozen=True)
class Topic:
    attr: str  # the attribute of ``Topics`` that holds its name
    name: str  # a template with {pool} and {lane} for a family of topics
    key: str
    events: tuple[type[Event], ...]
    partitions: int
    retention_ms: int
    producers: tuple[str, ...]
    readers: tuple[str, ...]  # stages reading it, in their own group or by assigning partitions (see ROLEs)
    cleanup_policy: str = "delete"

    @property
    def config(self) -> dict[str, str]:
        return {"retention.ms": str(self.retention_ms), "cleanup.policy": self.cleanup_policy}


REQUESTS = Topic("requests", "chat.requests", "user_id", (MessageSubmitted,), 6, 7 * DAY_MS,
                 (GATEWAY,), (ADMISSION,))
ADMITTED = Topic("admitted", "chat.admitted", "conversation_id", (RequestAdmitted, InputBlocked), 6, 7 * DAY_MS,
                 (ADMISSION,), (PROMPT,))
PROMPTS = Topic("prompts", "chat.prompts", "conversation_id", (PromptBuilt,), 6, 7 * DAY_MS,
                (PROMPT,), (SCHEDULER,))
# The token buffer: 10 minutes, the seed's TTL. Readers find a generation's partition from its key, so the
# SSE event id can be the bare offset.
TOKENS = Topic("tokens", "chat.tokens", "generation_id",
               (RequestRefused, GenerationQueued, GenerationStarted, TokensAppended, GenerationRetracted,
                GenerationFinished),
               6, 10 * MINUTE_MS, (ADMISSION, PROMPT, SCHEDULER, GENERATION), (GATEWAY, GENERATION))
REPLIES = Topic("replies", "chat.replies", "conversation_id", (GenerationFinished,), 6, 7 * DAY_MS,
                (GENERATION, SCHEDULER), (SETTLEMENT, PERSISTENCE, SCHEDULER, REAPER, BILLING))
# Broadcast: every worker reads every partition without a group.
CONTROL = Topic("control", "chat.control", "generation_id", (CancelRequested,), 1, 1 * HOUR_MS,
                (GATEWAY, ABANDONED, RETENTION), (GENERATION,))
USAGE = Topic("usage", "usage", "user_id", (UsageRecorded,), 6, 30 * DAY_MS,
              (SETTLEMENT, REAPER), (USAGE_ROLLUP, BILLING))
# Every stage that decodes records wraps the ones it cannot decode here; nothing reads it but people.
DEADLETTER = Topic("deadletter", "chat.deadletter", "source topic", (EventDeadLettered,), 1, 14 * DAY_MS,
                   (ADMISSION, PROMPT, SCHEDULER, GENERATION, SETTLEMENT, PERSISTENCE, USAGE_ROLLUP, PURGE), ())
# Deletions: the purge stage removes what a deleted conversation left behind; the audit keeps a year of what
# was removed (ids and counts, never text).
DELETIONS = Topic("deletions", "chat.deletions", "conversation_id", (ConversationDeleted,), 3, 7 * DAY_MS,
                  (GATEWAY, RETENTION), (PURGE,))
PURGES = Topic("purges", "audit.purges", "conversation_id", (ConversationPurged,), 1, 365 * DAY_MS,
               (PURGE,), ())
# One topic per (pool, lane): the scheduler's queues; titles and summaries go straight to the small pool's free lane.
GENERATE = Topic("generate", "generate.{pool}.{lane}", "conversation_id", (GenerationRequested,), 4, 7 * DAY_MS,
                 (SCHEDULER, PROMPT, PERSISTENCE), (GENERATION,))

FIXED: tuple[Topic, ...] = (REQUESTS, ADMITTED, PROMPTS, TOKENS, REPLIES, CONTROL, USAGE, DEADLETTER, DELETIONS,
                            PURGES)
ALL: tuple[Topic, ...] = (*FIXED, GENERATE)


@dataclass(frozen=True)
class Role:
    """What one stage reads and writes, declared in the stage's own module (its ``ROLE``)."""

    stage: str
    reads: tuple[Topic, ...]
    writes: tuple[Topic, ...]


def generate_topic_name(pool: str, lane: str) -> str:
    return GENERATE.name.format(pool=pool, lane=lane)


def catalogue(pools: Iterable[str]) -> tuple[tuple[str, Topic], ...]:
    """(unprefixed name, topic) for every topic of a deployment serving ``pools``."""
    fixed = tuple((t.name, t) for t in FIXED)
    return fixed + tuple((generate_topic_name(pool, lane), GENERATE) for pool in pools for lane in LANES)


class Topics:
    """Topic and consumer-group names as one deployment sees them (tests isolate themselves with a prefix)."""

    requests: str
    admitted: str
    prompts: str
    tokens: str
    replies: str
    control: str
    usage: str
    deadletter: str
    deletions: str
    purges: str

    def __init__(self, prefix: str = "", pools: Iterable[str] = ()) -> None:
        self.prefix, self.pools = prefix, tuple(pools)
        for topic in FIXED:
            setattr(self, topic.attr, prefix + topic.name)

    def generate(self, pool: str, lane: str) -> str:
        return self.prefix + generate_topic_name(pool, lane)

    def group(self, stage: str, pool: str | None = None) -> str:
        """The consumer group (faust: app id) of ``stage``; the generation stage has one per pool."""
        if stage not in STAGES:
            raise ValueError(f"unknown stage {stage!r}; the stages are {', '.join(STAGES)}")
        if (stage == GENERATION) != (pool is not None):
            raise ValueError("the generation stage, and only it, has a group per pool")
        return f"{self.prefix}{stage}" if pool is None else f"{self.prefix}{stage}.{pool}"

    def internal(self, stage: str, purpose: str) -> str:
        """A stage's own topic, such as the usage rollup's re-keyed copy of ``usage``."""
        return f"{self.group(stage)}-{purpose}"

    def all(self) -> list[tuple[str, Topic]]:
        """(name, topic) for every topic of this deployment (``generate.*`` for the pools it was given)."""
        return [(self.prefix + name, topic) for name, topic in catalogue(self.pools)]

    def internals(self) -> list[tuple[str, Topic]]:
        """(name, topic) for the stages' own topics. Made with the others, before any stage starts: a faust app
        that declares one makes it as it starts, and its consumer, subscribed a moment earlier, skipped it
        ("Ignoring missing topic") until its next metadata refresh, so the first records sent there waited."""
        by_plan = self.internal(USAGE_ROLLUP, "by-plan")  # the usage rollup's copy of ``usage``, keyed by plan
        return [(by_plan, replace(USAGE, attr="", name=by_plan.removeprefix(self.prefix), key="plan",
                                              retention_ms=7 * DAY_MS, producers=(USAGE_ROLLUP,),
                                              readers=(USAGE_ROLLUP,)))]
