"""Every Redis key Parley writes, in one place. Prefix ``parley:``; ids are Parley's own."""
from __future__ import annotations

PREFIX = "parley:"


def generation_started(generation_id: str) -> str:
    """Set by the worker at the first token; a redelivered request with it set is recovered, not restarted."""
    return f"{PREFIX}gen:{generation_id}:started"


def reader_heartbeat(generation_id: str) -> str:
    """Refreshed by whichever gateway streams the generation; absent for 30 s = abandoned."""
    return f"{PREFIX}gen:{generation_id}:reader"


def client_message(conversation_id: str, client_message_id: str) -> str:
    return f"{PREFIX}cmid:{conversation_id}:{client_message_id}"


def generation_owner(generation_id: str) -> str:
    return f"{PREFIX}gen:{generation_id}:owner"


def quota(user_id: str) -> str:
    return f"{PREFIX}quota:{user_id}"


def reservation(generation_id: str) -> str:
    return f"{PREFIX}resv:{generation_id}"


RESERVATIONS_BY_EXPIRY = f"{PREFIX}resv:by-expiry"
SETTLED = f"{PREFIX}settled"
