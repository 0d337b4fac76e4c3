"""Open streams on one gateway: a cap per user (a 429 with Retry-After past it) and one for the gateway (a 503
with Retry-After past it: another gateway behind the load balancer, or this one a moment later, has room).

Every reply stream (a send, a regenerate, an OpenAI call waiting for or streaming its reply) and every
resume (``Last-Event-ID``, ``starting_after``) holds a connection and a reader of ``chat.tokens`` for as long
as it is open; a resume also opens a Kafka reader to replay. One user holding 100 streams and looping resumes
raised another user's first token from 0.36 s to 4.8 s (issue 30). A slot is taken before anything is put in
or read, and given back when the response ends, however it ends (finished, client gone, error).
"""
from __future__ import annotations

import weakref
from collections import Counter
from typing import Any

from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from producers.gateway.errors import ApiError

RETRY_AFTER_S = 5.0


class StreamSlots:
    def __init__(self, cap: int, gateway_cap: int = 0) -> None:
        """``cap``: streams one user may hold open; ``gateway_cap``: streams of all users (0: no limit)."""
        self.cap, self.gateway_cap = cap, gateway_cap
        self.open: Counter[str] = Counter()
        self.total = 0

    def take(self, user_id: str) -> Slot:
        if self.open[user_id] >= self.cap:
            raise ApiError(429, "too_many_streams", f"You have {self.open[user_id]} replies or resumes open on "
                                                    f"this server; the limit is {self.cap}. Close one (or let it "
                                                    f"finish) and try again.", retry_after=RETRY_AFTER_S)
        if self.gateway_cap and self.total >= self.gateway_cap:
            raise ApiError(503, "server_full", f"This server holds {self.total} open replies and resumes, as many "
                                               "as it takes. Try again in a few seconds.", retry_after=RETRY_AFTER_S)
        self.open[user_id] += 1
        self.total += 1
        return Slot(self, user_id)

    def give_back(self, user_id: str) -> None:
        self.open[user_id] -= 1
        self.total -= 1
        if self.open[user_id] <= 0:
            del self.open[user_id]


class Slot:
    """One open stream; ``release`` is idempotent."""

    def __init__(self, slots: StreamSlots, user_id: str) -> None:
        self.slots, self.user_id, self.released = slots, user_id, False

    def release(self) -> None:
        if not self.released:
            self.released = True
            self.slots.give_back(self.user_id)

    def holding(self, response: Response) -> Response:
        """``response``, holding this slot until it has been sent (or abandoned)."""
        return Held(response, self)


class Held(Response):
    """Sends ``inner`` and then releases the slot, whether it finished, the client left or it failed. A
    response never sent (dropped before Starlette called it) releases the slot when it is collected."""

    def __init__(self, inner: Response, slot: Slot) -> None:  # no super().__init__: it would render a body
        self.inner, self.slot = inner, slot
        self.status_code, self.raw_headers, self.background = inner.status_code, inner.raw_headers, None
        weakref.finalize(self, slot.release)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.background is not None and self.inner.background is None:
            self.inner.background = self.background  # FastAPI hands its background tasks to the outer one
        try:
            await self.inner(scope, receive, send)
        finally:
            self.slot.release()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)
