"""Search over the caller's own conversation titles and messages (``infra/stores/search.py``)."""
from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Query, Request

from infra.stores.accounts import User
from infra.stores.search import MAX_QUERY_WORDS, words
from producers.gateway.auth import current_user, gateway_of
from producers.gateway.errors import ApiError

router = APIRouter(prefix="/v1", tags=["conversations"])


@router.get("/search")
async def search(request: Request, q: str = Query(max_length=200, description="words; each matches a word start"),
                 limit: int = Query(20, ge=1, le=50), user: User = Depends(current_user)) -> dict[str, Any]:
    """Titles and messages holding every word of ``q``: titles first, then messages newest first."""
    if not words(q, MAX_QUERY_WORDS):
        raise ApiError(422, "empty_query", "Search for at least one word of two or more letters "
                                           "(common words such as 'the' are not indexed).")
    hits = await gateway_of(request).search.search(user.user_id, q, limit)
    return {"query": q, "items": [{"conversation_id": h.conversation_id, "title": h.title,
                                   "message_id": h.message_id, "role": h.role, "snippet": h.snippet}
                                  for h in hits]}
