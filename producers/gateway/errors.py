"""Errors the gateway answers with: an HTTP status and a message a person can act on."""
from __future__ import annotations


class ApiError(Exception):
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
