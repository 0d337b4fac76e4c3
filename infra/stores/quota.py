"""Per-user quotas in Redis: reserve before generating, true up, settle exactly once.

Touches only Redis (keys from ``infra/stores/keys.py``). Every check-and-update is one
Lua script (``quota_*.lua`` beside this file), so concurrent admissions, a
redelivered reply and the reaper can race freely without overspending or
charging twice. Amounts are tokens (prompt + reply); days are UTC.

Cluster note: each script names every key it touches in KEYS, but a reservation
spans the user's keys and two deployment-wide sorted sets, so on Redis Cluster
they would need one hash tag per user and per-slot expiry sets. One primary runs
these scripts far faster than the seed's 35 requests a second need.
"""
from __future__ import annotations

import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from infra.config.plans import Plan
from infra.config.settings import Settings
from infra.stores import keys
from infra.stores.quota_outcomes import (
    Refusal,
    Reservation,
    Settled,
    next_midnight,
    refusal,
    reservation_from,
    settled_from,
    utc_day,
)

_HERE = Path(__file__).parent
DAY_S = 86_400


def _script(name: str) -> str:
    return (_HERE / f"quota_{name}.lua").read_text()


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _pairs(flat: list[Any]) -> dict[str, str]:
    items = [_text(v) for v in flat]
    return dict(zip(items[::2], items[1::2], strict=True))  # Redis answers key, value pairs


def _strings(mapping: Mapping[Any, Any]) -> dict[str, str]:
    return {_text(k): _text(v) for k, v in mapping.items()}


class Quota:
    def __init__(self, redis: Any, plans: Mapping[str, Plan], *, scope: str = "", reservation_ttl_s: float = 300,
                 settled_ttl_s: int = 2 * DAY_S, day_ttl_s: int = 8 * DAY_S,
                 concurrency_retry_s: float = 5.0) -> None:
        """``scope`` (the deployment's topic prefix) isolates the deployment-wide sets; users are global."""
        self.redis, self.plans = redis, dict(plans)
        self.reservation_ttl_s, self.settled_ttl_s, self.day_ttl_s = reservation_ttl_s, settled_ttl_s, day_ttl_s
        self.concurrency_retry_s = concurrency_retry_s
        self.expiry_key = keys.reservations_by_expiry(scope)
        self.outbox_key = keys.usage_unpublished(scope)
        self._reserve = redis.register_script(_script("reserve"))
        self._true_up = redis.register_script(_script("true_up"))
        self._settle = redis.register_script(_script("settle"))
        self._published = redis.register_script(_script("published"))
        self._release = redis.register_script(_script("release"))

    @classmethod
    def configured(cls, redis: Any, plans: Mapping[str, Plan], settings: Settings) -> Quota:
        """The process's quota, built once at start-up. Every process that reserves or settles must agree on
        the scope (the topic prefix) and the reservation lifetime (``Settings.reservation_ttl_s``)."""
        return cls(redis, plans, scope=settings.topic_prefix, reservation_ttl_s=settings.reservation_ttl_s)

    async def reserve(self, user_id: str, plan_name: str, generation_id: str, prompt_estimate: int,
                      now: float | None = None, *, reply_cap: int | None = None,
                      conversation_id: str = "") -> Reservation | Refusal:
        """Reserve ``prompt_estimate`` + the plan's reply cap (or a smaller ``reply_cap``), or refuse."""
        plan = self.plans[plan_name]
        now = time.time() if now is None else now
        cap = plan.reply_cap if reply_cap is None else min(reply_cap, plan.reply_cap)
        want = prompt_estimate + cap
        day = utc_day(now)
        reply = await self._reserve(
            keys=[keys.quota_day(user_id, day), keys.quota_bucket(user_id), keys.quota_running(user_id),
                  keys.reservation(generation_id), self.expiry_key, keys.settled(generation_id)],
            args=[generation_id, want, repr(now), plan.daily_tokens, plan.bucket_tokens_per_minute / 60,
                  plan.bucket_burst, plan.max_running, self.reservation_ttl_s, self.day_ttl_s, user_id, plan_name,
                  day, prompt_estimate, cap, conversation_id, self.settled_ttl_s])
        kind, rest = _text(reply[0]), reply[1:]
        if kind == "refused":
            reason, detail, detail2 = (_text(v) for v in rest)
            return refusal(plan, reason, detail, detail2, want, now, self.concurrency_retry_s)
        return reservation_from(_pairs(rest), kind)

    async def true_up(self, generation_id: str, real_prompt_tokens: int) -> int | None:
        """Set the reservation's prompt part to the real count; the change in tokens, or None if settled."""
        found = await self._locate(keys.reservation(generation_id))
        if found is None:
            return None
        user_id, day, plan = found
        reply = await self._true_up(
            keys=[keys.reservation(generation_id), keys.quota_day(user_id, day), keys.quota_bucket(user_id)],
            args=[real_prompt_tokens, repr(time.time()), plan.bucket_burst, plan.bucket_tokens_per_minute / 60])
        return None if reply is None else int(reply[0])

    async def settle(self, generation_id: str, tokens_in: int, tokens_out: int, *, tokens_cached: int = 0,
                     status: str = "complete", model: str = "", pool: str = "", started_at: float = 0.0,
                     finished_at: float = 0.0, now: float | None = None, block_category: str = "",
                     rules_version: str = "") -> Settled | None:
        """Charge real use exactly once; None if already settled (or never reserved)."""
        found = await self._locate(keys.reservation(generation_id))
        if found is None:
            return None
        user_id, day, plan = found
        now = time.time() if now is None else now
        detail = {"tokens_cached": tokens_cached, "status": status, "model": model, "pool": pool,
                  "started_at": repr(started_at), "finished_at": repr(finished_at),
                  "block_category": block_category, "rules_version": rules_version}
        reply = await self._settle(
            keys=[keys.reservation(generation_id), keys.quota_day(user_id, day), keys.quota_running(user_id),
                  self.expiry_key, keys.settled(generation_id), keys.quota_bucket(user_id), self.outbox_key],
            args=[generation_id, tokens_in, tokens_out, repr(now), self.settled_ttl_s, plan.bucket_burst,
                  plan.bucket_tokens_per_minute / 60, *[x for kv in detail.items() for x in kv]])
        return None if reply is None else settled_from(_pairs(reply))

    async def free_slot(self, user_id: str, generation_id: str) -> None:
        """The generation no longer runs (its worker is publishing its finish): its running slot is free now,
        not when settlement gets to it, so a client that waits for one reply before asking the next is never
        refused for replies it is no longer waiting on. Its tokens stay reserved until settlement charges
        them; settlement's own removal of the slot finds it gone, which is the same end state."""
        await self.redis.zrem(keys.quota_running(user_id), generation_id)

    async def release(self, generation_id: str, reason: str, *, user_id: str = "", plan: str = "",
                      now: float | None = None) -> int | None:
        """Give a generation's whole reservation back and free its slot, charging 0, exactly once: the tokens
        released, or None when it was already settled or released. ``user_id``/``plan`` are needed only when
        admission may not have reserved yet (the gateway gave up): the marker then keeps admission away."""
        now = time.time() if now is None else now
        found = await self._locate(keys.reservation(generation_id))
        if found is None and not user_id:
            return None  # nothing reserved and nobody to block: settled, released or never admitted
        user_id, day = (found[0], found[1]) if found else (user_id, utc_day(now))
        plan_obj = found[2] if found else self.plans[plan]
        reply = await self._release(
            keys=[keys.reservation(generation_id), keys.quota_day(user_id, day), keys.quota_running(user_id),
                  self.expiry_key, keys.settled(generation_id), keys.quota_bucket(user_id)],
            args=[generation_id, repr(now), self.settled_ttl_s, plan_obj.bucket_burst,
                  plan_obj.bucket_tokens_per_minute / 60, reason, user_id, plan, day])
        return None if reply is None else int(reply)

    async def expired(self, now: float | None = None) -> list[str]:
        """Generation ids whose reservation expired unsettled, oldest first."""
        now = time.time() if now is None else now
        return [_text(g) for g in await self.redis.zrangebyscore(self.expiry_key, "-inf", now)]

    async def forget_expired(self, generation_id: str) -> None:
        """Drop an expiry entry whose reservation hash is gone (it outlived its own TTL): nothing to settle."""
        await self.redis.zrem(self.expiry_key, generation_id)

    async def reservation(self, generation_id: str) -> Reservation | None:
        fields = _strings(await self.redis.hgetall(keys.reservation(generation_id)))
        return reservation_from(fields, "existing") if fields else None

    async def settled(self, generation_id: str) -> Settled | None:
        fields = _strings(await self.redis.hgetall(keys.settled(generation_id)))
        return settled_from(fields) if fields else None

    async def unpublished(self, older_than_s: float = 0.0, now: float | None = None) -> list[Settled]:
        """The usage outbox: settled generations whose UsageRecorded Kafka has not acknowledged."""
        now = time.time() if now is None else now
        pending = []
        for gen in await self.redis.zrangebyscore(self.outbox_key, "-inf", now - older_than_s):
            marker = await self.settled(_text(gen))
            if marker is None:  # the marker outlived its TTL: nothing left to publish from
                await self.redis.zrem(self.outbox_key, gen)
            elif not marker.published:
                pending.append(marker)
        return pending

    async def mark_published(self, generation_id: str) -> None:
        await self._published(keys=[keys.settled(generation_id), self.outbox_key], args=[generation_id])

    async def snapshot(self, user_id: str, plan_name: str, now: float | None = None) -> dict[str, Any]:
        """Today's standing for GET /v1/usage: used, reserved, remaining, bucket, running, reset times."""
        plan = self.plans[plan_name]
        now = time.time() if now is None else now
        day = utc_day(now)
        pipe = self.redis.pipeline(transaction=True)
        pipe.hmget(keys.quota_day(user_id, day), "used", "reserved", "replies")
        pipe.hmget(keys.quota_bucket(user_id), "level", "ts")
        pipe.zcount(keys.quota_running(user_id), f"({now!r}", "+inf")
        (used, reserved, replies), (level, ts), running = await pipe.execute()
        used, reserved = int(used or 0), int(reserved or 0)
        rate = plan.bucket_tokens_per_minute / 60
        bucket = plan.bucket_burst if level is None else min(
            plan.bucket_burst, float(level) + max(0.0, now - float(ts)) * rate)
        midnight = next_midnight(now)
        return {
            "user_id": user_id, "plan": plan_name, "day": day,
            "daily_limit": plan.daily_tokens, "used": used, "reserved": reserved, "replies": int(replies or 0),
            "remaining": max(0, plan.daily_tokens - used - reserved),
            "resets_at": midnight, "resets_in_s": round(midnight - now, 3),
            "bucket": {"level": round(bucket, 1), "burst": plan.bucket_burst,
                       "tokens_per_minute": plan.bucket_tokens_per_minute,
                       "full_in_s": round((plan.bucket_burst - bucket) / rate, 3)},
            "running": int(running), "max_running": plan.max_running,
        }

    async def _locate(self, resv_key: str) -> tuple[str, str, Plan] | None:
        """A reservation's user, day and plan: fixed at reserve time, so safe to read before the script,
        which checks again that the reservation is still there."""
        user_id, day, plan_name = await self.redis.hmget(resv_key, "user_id", "day", "plan")
        if user_id is None:
            return None
        return _text(user_id), _text(day), self.plans[_text(plan_name)]
