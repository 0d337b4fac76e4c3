"""What a user has left: today's tokens, the per-minute bucket, running replies, reset times."""
from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Request

from infra.stores.accounts import User
from producers.gateway.auth import current_user, gateway_of
from producers.gateway.errors import ApiError, responses

router = APIRouter(prefix="/v1", tags=["usage"], responses=responses(401, 422, 503))


@router.get("/usage")
async def usage(request: Request, user: User = Depends(current_user)) -> dict[str, Any]:
    gw = gateway_of(request)
    if gw.quota is None:
        raise ApiError(503, "quota_unavailable", "Usage is not available on this gateway right now.")
    snapshot = await gw.quota.snapshot(user.user_id, user.plan)
    return {"user_id": user.user_id, "plan": user.plan, **snapshot}
