"""Errors the gateway answers with: an HTTP status and a message a person can act on."""
from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from schemas.errors import ParleyError


class ApiError(ParleyError):
    """An error answered to the client with ``status`` (the HTTP status, per instance) and a body."""

    status: int

    def __init__(self, status: int, code: str, message: str, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.status, self.code, self.message, self.retry_after = status, code, message, retry_after

    def body(self) -> dict[str, object]:
        err: dict[str, object] = {"code": self.code, "message": self.message}
        if self.retry_after is not None:
            err["retry_after_s"] = round(self.retry_after, 1)
        return {"error": err}

    def headers(self) -> dict[str, str]:
        headers = {}
        if self.retry_after is not None:
            headers["Retry-After"] = str(max(1, int(self.retry_after + 0.999)))
        if self.status == 401:
            headers["WWW-Authenticate"] = "Bearer"
        return headers


def not_found(what: str) -> ApiError:
    # Another user's thing answers exactly like a missing one: existence is not leaked.
    return ApiError(404, "not_found", f"No such {what}, or it is not yours.")


def unauthorized(message: str = "Send 'Authorization: Bearer <token>'; `parley user create` prints one.") -> ApiError:
    return ApiError(401, "unauthorized", message)


def unavailable(backend: str) -> ApiError:
    return ApiError(503, "backend_unavailable", f"{backend} is not reachable right now; nothing was lost. "
                                                "Try again in a few seconds.", retry_after=5)


def too_large(message: str) -> ApiError:
    """A request bigger than Kafka takes in one record: no retry can succeed, so never a 503."""
    return ApiError(413, "request_too_large", message)


class ErrorDetail(BaseModel):
    code: str
    message: str
    retry_after_s: float | None = None


class ErrorBody(BaseModel):
    """Every error the native API answers: ``{"error": {"code", "message", "retry_after_s"?}}``."""

    error: ErrorDetail


WHY = {400: "bad request (a cursor or body this API cannot read)", 401: "no or bad token", 403: "not allowed here",
       404: "missing, or someone else's", 409: "client_message_id already used with other content",
       413: "message too long, or the whole request too large for one Kafka record", 422: "invalid input",
       429: "quota; see Retry-After",
       503: "overloaded or a backend unreachable; see Retry-After"}


def responses(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI entries for the error statuses a route can answer."""
    return {s: {"model": ErrorBody, "description": WHY[s]} for s in statuses}


FRAMEWORK_CODES = {400: "bad_request", 404: "not_found", 405: "method_not_allowed", 413: "too_large",
                   415: "unsupported_media_type"}


def from_framework(status: int, detail: object) -> ApiError:
    """Starlette's own errors (unknown path, wrong method, unreadable body) in the documented shape."""
    if status == 404:
        return ApiError(404, "not_found", "No such endpoint. The API is described at /docs.")
    if status == 405:
        return ApiError(405, "method_not_allowed", "That method is not allowed on this endpoint; see /docs.")
    if status == 400:  # FastAPI's "error parsing the body": not UTF-8, or nested past the parser's depth
        return ApiError(422, "invalid_json", "The request body could not be read: send UTF-8 JSON "
                                             "(nested no deeper than a few hundred levels).")
    message = detail if isinstance(detail, str) else "The request could not be handled."
    return ApiError(status, FRAMEWORK_CODES.get(status, "error"), message)
