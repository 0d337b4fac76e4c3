"""Every Redis key Parley writes, in one place. Prefix ``parley:``; ids are Parley's own."""
from __future__ import annotations

PREFIX = "parley:"
RETRACTED_TTL_S = 6 * 3600  # well past chat.tokens' 10 minutes: no replay of the buffer outlives the marker


def generation_started(generation_id: str) -> str:
    """Set by the worker at the first token; a redelivered request with it set is recovered, not restarted."""
    return f"{PREFIX}gen:{generation_id}:started"


def generation_queued(generation_id: str) -> str:
    """Set by the scheduler as it queues a generation (or serves it a prepared reply): the client has its
    stream from then on, so a redelivery of the generation's earlier records after a crash is past any
    deadline but not late work; it must not be dropped, released or ended as failed."""
    return f"{PREFIX}gen:{generation_id}:queued"


def generation_epoch(generation_id: str) -> str:
    """Incremented by each worker that takes the generation on; its events carry the value (fencing)."""
    return f"{PREFIX}gen:{generation_id}:epoch"


WORKER_ALIVE_TTL_S = 4


def worker_alive(worker_id: str) -> str:
    """Refreshed every second by a live generation worker; gone = its generations await recovery."""
    return f"{PREFIX}worker:{worker_id}:alive"
def generation_retracted(generation_id: str) -> str:
    """Set by the worker before it writes ``GenerationRetracted``: replays of the token buffer skip the
    generation's text (value: the last seq a reader may have shown)."""
    return f"{PREFIX}gen:{generation_id}:retracted"


def reader_heartbeat(generation_id: str) -> str:
    """Refreshed by whichever gateway streams the generation; absent for 30 s = abandoned."""
    return f"{PREFIX}gen:{generation_id}:reader"


def client_message(conversation_id: str, client_message_id: str) -> str:
    return f"{PREFIX}cmid:{conversation_id}:{client_message_id}"


def conversation_generations(conversation_id: str) -> str:
    """Set of a conversation's generation ids (added when the gateway claims one): what a delete cancels."""
    return f"{PREFIX}conv:{conversation_id}:gens"


def generation_owner(generation_id: str) -> str:
    return f"{PREFIX}gen:{generation_id}:owner"


def response(generation_id: str) -> str:
    """A Responses-API response's request (model, instructions, background, ...), JSON; any gateway reads it."""
    return f"{PREFIX}gen:{generation_id}:response"


def quota(user_id: str) -> str:
    return f"{PREFIX}quota:{user_id}"


def quota_day(user_id: str, day: str) -> str:
    """Hash of one user's UTC day: ``used`` (charged), ``reserved`` (outstanding), ``replies``."""
    return f"{quota(user_id)}:day:{day}"


def quota_bucket(user_id: str) -> str:
    """Hash ``level``, ``ts``: the per-minute token bucket as of ``ts``."""
    return f"{quota(user_id)}:bucket"


def quota_running(user_id: str) -> str:
    """Sorted set of the user's running generations, scored by reservation expiry."""
    return f"{quota(user_id)}:running"


def reservation(generation_id: str) -> str:
    return f"{PREFIX}resv:{generation_id}"


def reservations_by_expiry(scope: str = "") -> str:
    """Sorted set generation_id -> expiry; ``scope`` (the topic prefix) isolates test deployments."""
    return f"{PREFIX}{scope}resv:by-expiry"


def settled(generation_id: str) -> str:
    """The settled marker: what was charged and the UsageRecorded fields; kept a couple of days."""
    return f"{PREFIX}settled:{generation_id}"


def usage_unpublished(scope: str = "") -> str:
    """Outbox: settled generations whose UsageRecorded is not yet acknowledged by Kafka."""
    return f"{PREFIX}{scope}usage:unpublished"


def conversation_changed(conversation_id: str) -> str:
    """A fresh value each time a conversation's row is changed by anyone but persistence (a rename, a deletion):
    persistence keeps the rows it wrote and reads the row again only when this differs from what it saw."""
    return f"{PREFIX}conv:{conversation_id}:changed"


def title_requested(conversation_id: str) -> str:
    """Set once when persistence asks the small pool for a conversation's title."""
    return f"{PREFIX}conv:{conversation_id}:title-requested"


def abandoned_cancelled(generation_id: str) -> str:
    return f"{PREFIX}gen:{generation_id}:abandoned"


def finished_reply(generation_id: str) -> str:
    """The ended reply, written before its end event is published, until persistence has surely saved it."""
    return f"{PREFIX}gen:{generation_id}:finished"


def summary_requested(conversation_id: str) -> str:
    """Set while a summary of a conversation's older turns is being written (one at a time)."""
    return f"{PREFIX}conv:{conversation_id}:summary-requested"


def page_session(session_hash: str) -> str:
    """The page's signed-in session -> user id, with the session's expiry as TTL; keyed by the id's SHA-256."""
    return f"{PREFIX}session:{session_hash}"


REPLICA_TTL_S = 3  # a worker announces every second; gone for 3 s = left the pool


def replica(group: str, worker_id: str) -> str:
    """A generation worker's announcement (JSON ``ReplicaAnnounced``): the partitions it owns, its load, the
    prefixes its engine holds. Expires REPLICA_TTL_S after the last beat."""
    return f"{PREFIX}replica:{group}:{worker_id}"


def replicas(group: str) -> str:
    """Set of the worker ids that announced in a pool's consumer group (a member whose key expired has left)."""
    return f"{PREFIX}replicas:{group}"


def tokens_revoked() -> str:
    """Pub/sub channel: the hash of each revoked API token, so every gateway drops it from its cache at once."""
    return f"{PREFIX}tokens:revoked"


def token_dropped(token_hash: str) -> str:
    """Counter: the gateways that heard a revoked token's hash and dropped it from their caches (a minute)."""
    return f"{PREFIX}tokens:dropped:{token_hash}"
