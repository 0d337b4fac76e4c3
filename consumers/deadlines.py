"""Work past its deadline is dropped: the gateway already answered the client 503 (no decision in time,
or Kafka too slow to acknowledge), so running it would generate and bill a reply nobody waits for.

The deadline is set by the gateway on ``MessageSubmitted`` and carried by ``RequestAdmitted`` and
``PromptBuilt``; once a request is queued the client has its stream and the deadline no longer applies.
"""
from __future__ import annotations

import time


def past_deadline(deadline: float, now: float | None = None) -> bool:
    return deadline > 0 and (time.time() if now is None else now) > deadline
