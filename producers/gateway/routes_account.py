"""The caller's account as the page's settings show it: plan, and how long conversations are kept.

Read from the plans file the gateway loaded at start; no store round trip.
"""
from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Request

from infra.stores.accounts import User
from producers.gateway.auth import current_user, gateway_of
from producers.gateway.errors import responses

router = APIRouter(prefix="/v1", tags=["account"], responses=responses(401))


@router.get("/account")
async def account(request: Request, user: User = Depends(current_user)) -> dict[str, Any]:
    """Plan and data retention: ``retention_days`` (0: kept until deleted), ``no_retention`` (replies are
    streamed and nothing is stored), and how soon a deleted conversation's data is purged."""
    gw = gateway_of(request)
    plan = gw.plans.get(user.plan)
    return {"user_id": user.user_id, "plan": user.plan, "display_name": user.display_name,
            "retention_days": plan.retention_days if plan else 0.0,
            "no_retention": plan.no_retention if plan else False,
            "purge_after_delete_s": gw.settings.purge_delay_s, "default_model": gw.settings.default_pool}
