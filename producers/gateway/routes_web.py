"""The chat page: ``/`` serves ``static/index.html``; its script and styles are under ``/static``.

Static files only, no build step. The page talks to the same ``/v1`` API as every other
client, signed in by the session cookie. Its Content-Security-Policy allows scripts, styles
and connections from this origin only: no inline script runs, whatever a reply contains.
"""
from __future__ import annotations

import os
from pathlib import Path

from fastapi import APIRouter, FastAPI
from fastapi.responses import FileResponse
from starlette.responses import Response
from starlette.staticfiles import PathLike, StaticFiles
from starlette.types import Scope

STATIC = Path(__file__).with_name("static")
CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; "
       "font-src 'self'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'")
PAGE_HEADERS = {"Content-Security-Policy": CSP, "X-Content-Type-Options": "nosniff",
                "Referrer-Policy": "no-referrer", "Cache-Control": "no-cache"}

router = APIRouter(include_in_schema=False)


@router.get("/")
async def page() -> FileResponse:
    return FileResponse(STATIC / "index.html", media_type="text/html", headers=PAGE_HEADERS)


class _Static(StaticFiles):
    """Static files that the browser revalidates (no build step means no hashed names to cache by)."""

    def file_response(self, full_path: PathLike, stat_result: os.stat_result, scope: Scope,
                      status_code: int = 200) -> Response:
        response = super().file_response(full_path, stat_result, scope, status_code)
        response.headers.update(PAGE_HEADERS)
        return response


def mount(app: FastAPI) -> None:
    app.include_router(router)
    app.mount("/static", _Static(directory=STATIC), name="static")
