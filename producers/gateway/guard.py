"""ASGI middleware in front of every route: what one caller may cost the gateway before a route runs.

- **Body size**: a body over ``max_body_bytes`` is a 413 before it is read: by its
  ``Content-Length`` at once, or, sent chunked, as soon as the bytes read pass the limit. Without it a
  client could make the gateway hold any number of bytes in memory while the JSON was parsed.
- **Refusal budget**: each caller (an API token or a page session) has a bucket of refused requests
  (every 4xx a route answers it), ``refusal_burst`` deep and refilled at
  ``refusals_per_minute``. While it is empty the caller's requests are a 429 with Retry-After
  here, before routing, authentication or the body: a client looping on a request the gateway refuses
  costs the gateway a header scan per attempt, not a parse and a check. A caller whose requests
  succeed never spends the budget. Requests with no credentials are not budgeted (they are refused by
  authentication, which reads no body; a flood from one address is the load balancer's to limit).
- **Hold**: such a request is first held until the bucket has a refusal back, at most ``refusal_hold_s``
  (a timer, no CPU), then heard or answered 429. A client that ignores Retry-After and loops gets one answer
  per connection per hold instead of one per millisecond, so its loop no longer takes the gateway's CPU from
  other callers. At most HOLD_PER_CALLER held at once per caller and HOLD_MAX in all; past them, the 429 at once.

All are per gateway and in memory: no store round trip, no record. One lookup in a dict per request.
"""
from __future__ import annotations

import asyncio
import time
from collections import Counter, OrderedDict
from collections.abc import Awaitable, Callable

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from infra.config.settings import Settings
from producers.gateway import openai_compat
from producers.gateway.auth import SESSION_COOKIE
from producers.gateway.errors import ApiError
from producers.gateway.metrics import GUARD_REFUSALS

BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})
MAX_CALLERS = 100_000  # buckets kept; the least recently refused go first (a full bucket is the default)
HOLD_PER_CALLER = 64  # requests of one caller held at once (see the module's Hold)
HOLD_MAX = 4096  # requests held at once on this gateway
HOLD_SLACK_S = 0.01  # held past the refill by this much, so the clock and rounding never leave it just short
_COOKIE_PREFIX = SESSION_COOKIE.encode() + b"="


class RefusalBudget:
    """A token bucket of refusals per caller: ``burst`` deep, ``per_minute`` back each minute."""

    def __init__(self, burst: int, per_minute: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.burst, self.rate, self.clock = burst, per_minute / 60.0, clock
        self.buckets: OrderedDict[bytes, tuple[float, float]] = OrderedDict()  # caller -> (level, at)

    @property
    def enabled(self) -> bool:
        return self.burst > 0 and self.rate > 0

    def _level(self, caller: bytes, now: float) -> float:
        level, at = self.buckets.get(caller, (self.burst, now))
        return min(float(self.burst), level + (now - at) * self.rate)

    def wait_s(self, caller: bytes) -> float:
        """0 when the caller may be heard now; else the seconds until one refusal is back."""
        if caller not in self.buckets:
            return 0.0
        level = self._level(caller, self.clock())
        return 0.0 if level >= 1.0 else (1.0 - level) / self.rate

    def refund(self, caller: bytes) -> None:
        """Gives back a refusal taken ahead (``Guard._held_for``) for a request that was not refused."""
        if caller in self.buckets:
            level, at = self.buckets[caller]
            self.buckets[caller] = (min(float(self.burst), level + 1.0), at)

    def refused(self, caller: bytes) -> None:
        now = self.clock()
        self.buckets[caller] = (self._level(caller, now) - 1.0, now)
        self.buckets.move_to_end(caller)
        if len(self.buckets) > MAX_CALLERS:
            self.buckets.popitem(last=False)


def caller_of(headers: list[tuple[bytes, bytes]]) -> tuple[bytes | None, int | None]:
    """(the caller's credential, the declared body length) from the raw headers, in one pass."""
    caller: bytes | None = None
    cookie: bytes | None = None
    length: int | None = None
    for name, value in headers:
        if name == b"authorization":
            caller = value
        elif name == b"cookie":
            cookie = value
        elif name == b"content-length":
            try:
                length = int(value)
            except ValueError:
                length = None  # the server refuses a malformed length before the app sees it
    if caller is None and cookie is not None:
        for part in cookie.split(b";"):
            part = part.strip()
            if part.startswith(_COOKIE_PREFIX):
                caller = part
                break
    return caller, length


class Guard:
    def __init__(self, app: ASGIApp, settings: Settings) -> None:
        self.app, self.max_body = app, settings.max_body_bytes
        self.budget = RefusalBudget(settings.refusal_burst, settings.refusals_per_minute)
        self.hold_s = settings.refusal_hold_s
        self.held: Counter[bytes] = Counter()  # caller -> its requests held now
        self.holding = 0  # requests held now, all callers

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        caller, length = caller_of(scope["headers"])
        budgeted = caller if self.budget.enabled else None  # the caller whose refusals are counted
        wait, taken = await self._held_for(budgeted) if budgeted is not None else (0.0, False)
        if wait > 0:
            GUARD_REFUSALS.labels("refusal_budget").inc()
            await _answer(scope, receive, send, ApiError(
                429, "too_many_refused", f"Too many of your requests were refused lately: after {self.budget.burst} "
                f"refused in a row, this gateway hears {self.budget.rate * 60:.0f} a minute from one caller. Fix the "
                f"request before sending it again; the next is heard in {wait:.1f} s.", retry_after=wait))
            return
        if scope["method"] in BODY_METHODS:
            if length is not None and length > self.max_body:
                await self._too_large(scope, receive, send, length)
                return
            if length is None:  # chunked: read up to the limit before the route sees a byte
                chunks = await _read_up_to(receive, self.max_body)
                if chunks is None:
                    await self._too_large(scope, receive, send, None)
                    return
                receive = _replay(chunks, receive)
        if budgeted is not None:
            send = self._counting(budgeted, send, taken)
        await self.app(scope, receive, send)

    async def _held_for(self, caller: bytes) -> tuple[float, bool]:
        """(0 when the caller may be heard now, else the seconds until it may; whether a refusal was taken ahead
        for it). Held first, within the limits; a held request heard takes the refusal that came back at once,
        so of several held only one is heard per refusal refilled (given back if it is not refused)."""
        wait = self.budget.wait_s(caller)
        if wait <= 0 or self.hold_s <= 0 or self.held[caller] >= HOLD_PER_CALLER or self.holding >= HOLD_MAX:
            return wait, False
        self.held[caller] += 1
        self.holding += 1
        try:
            await asyncio.sleep(min(wait + HOLD_SLACK_S, self.hold_s))
        finally:
            self.holding -= 1
            self.held[caller] -= 1
            if self.held[caller] <= 0:
                del self.held[caller]
        wait = self.budget.wait_s(caller)
        if wait > 0:
            return wait, False
        self.budget.refused(caller)
        return 0.0, True

    def _counting(self, caller: bytes, send: Send, taken: bool = False) -> Send:
        """Counts a 4xx answer as a refusal; ``taken``: one was taken ahead, given back for any other answer."""
        async def counted(message: Message) -> None:
            if message["type"] == "http.response.start":
                refused = 400 <= message["status"] < 500
                if refused and not taken:
                    self.budget.refused(caller)
                elif taken and not refused:
                    self.budget.refund(caller)
            await send(message)
        return counted

    async def _too_large(self, scope: Scope, receive: Receive, send: Send, length: int | None) -> None:
        GUARD_REFUSALS.labels("body_size").inc()
        size = f"{length:,} bytes" if length is not None else f"over {self.max_body:,} bytes"
        await _answer(scope, receive, send, ApiError(
            413, "request_too_large", f"The request body is {size}; the limit is {self.max_body:,}. "
                                      "Send a shorter history or fewer messages."))


async def _read_up_to(receive: Receive, limit: int) -> list[Message] | None:
    """The body's messages while they total at most ``limit`` bytes, else None (the rest left unread)."""
    chunks: list[Message] = []
    size = 0
    while True:
        message = await receive()
        chunks.append(message)
        if message["type"] != "http.request":
            return chunks  # the client left: the route hears it
        size += len(message.get("body", b""))
        if size > limit:
            return None
        if not message.get("more_body", False):
            return chunks


def _replay(chunks: list[Message], receive: Receive) -> Callable[[], Awaitable[Message]]:
    pending = list(chunks)

    async def replayed() -> Message:
        return pending.pop(0) if pending else await receive()
    return replayed


async def _answer(scope: Scope, receive: Receive, send: Send, err: ApiError) -> None:
    """The error in the shape the path's clients parse, as the routes answer. The connection stays open: the
    server drops an unread body as it arrives (closing at once would reset a client still sending, which then
    never reads the 413)."""
    await openai_compat.error_response(scope.get("path", ""), err)(scope, receive, send)
