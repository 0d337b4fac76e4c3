"""The caller's account as the page's settings show it: plan, how long conversations are kept, custom
instructions and the model new chats start with.

The plan comes from the plans file the gateway loaded at start; the settings from ``preferences`` (one read by
key, and the instructions' data key when this gateway has not cached it). ``PATCH`` changes the fields it
names and nothing else; new instructions apply to conversations made afterwards.
"""
from __future__ import annotations

import unicodedata
from typing import Any

from fastapi import APIRouter, Depends, Request
from pydantic import BaseModel, ConfigDict, Field

from infra.stores.accounts import User
from infra.stores.preferences import MAX_INSTRUCTIONS_CHARS, Prefs
from producers.gateway.auth import current_user, gateway_of
from producers.gateway.errors import ApiError, responses
from producers.gateway.text import Text

router = APIRouter(prefix="/v1", tags=["account"], responses=responses(401))


class AccountChanges(BaseModel):
    """The settings to change; a field left out stays as it is."""

    model_config = ConfigDict(extra="forbid")
    instructions: Text | None = Field(default=None, description=(
        f"custom instructions for new conversations, up to {MAX_INSTRUCTIONS_CHARS:,} characters; empty or null "
        "clears them"))
    default_model: Text | None = Field(default=None, description="a pool of GET /v1/models that new chats start "
                                                                 "with; null: the service's default")


def clean_instructions(raw: str | None) -> str | None:
    """Instructions as stored: trimmed, line breaks as ``\\n``; None for nothing. A 422 naming the reason for text
    over the limit or with control characters (NUL, escape: what no person types)."""
    text = (raw or "").replace("\r\n", "\n").replace("\r", "\n").strip()
    if not text:
        return None
    if len(text) > MAX_INSTRUCTIONS_CHARS:
        raise ApiError(422, "instructions_too_long", f"Your instructions are {len(text):,} characters; the limit is "
                                                     f"{MAX_INSTRUCTIONS_CHARS:,}. Shorten them and save again.")
    bad = next((ch for ch in text if unicodedata.category(ch) == "Cc" and ch not in "\n\t"), None)
    if bad is not None:
        raise ApiError(422, "bad_instructions", f"Your instructions contain a control character (U+{ord(bad):04X}); "
                                                "use plain text.")
    return text


def _account(gw: Any, user: User, prefs: Prefs) -> dict[str, Any]:
    plan = gw.plans.get(user.plan)
    chosen = prefs.default_model if prefs.default_model in gw.models else None  # a pool since removed: the default
    return {"user_id": user.user_id, "plan": user.plan, "display_name": user.display_name,
            "retention_days": plan.retention_days if plan else 0.0,
            "no_retention": plan.no_retention if plan else False,
            "purge_after_delete_s": gw.settings.purge_delay_s,
            "default_model": chosen or gw.settings.default_pool, "instructions": prefs.instructions}


@router.get("/account")
async def account(request: Request, user: User = Depends(current_user)) -> dict[str, Any]:
    """Plan and data retention: ``retention_days`` (0: kept until deleted), ``no_retention`` (replies are
    streamed and nothing is stored), and how soon a deleted conversation's data is purged; the caller's
    ``instructions`` (null: none) and ``default_model`` (theirs, else the service's)."""
    gw = gateway_of(request)
    return _account(gw, user, await gw.preferences.get(user.user_id))


@router.patch("/account", responses=responses(422))
async def change_account(request: Request, body: AccountChanges,
                         user: User = Depends(current_user)) -> dict[str, Any]:
    """Change the custom instructions, the default model, or both; answers the account as ``GET`` does.
    Instructions are stored sealed; each save erases the previous words (their key is destroyed)."""
    gw = gateway_of(request)
    fields = body.model_fields_set
    model = body.default_model
    if "default_model" in fields and model is not None and model not in gw.models:
        raise ApiError(422, "unknown_model", f"Unknown model {model!r}. Choose one of: {', '.join(gw.models)}.")
    text = clean_instructions(body.instructions) if "instructions" in fields else None
    if text is not None and gw.keeps_nothing(user):
        raise ApiError(422, "no_retention", "Your plan keeps nothing, so custom instructions cannot be stored.")
    if "default_model" in fields:
        await gw.preferences.set_default_model(user.user_id, model)
    if "instructions" in fields:
        await gw.preferences.set_instructions(user.user_id, text)
    return _account(gw, user, await gw.preferences.get(user.user_id))
