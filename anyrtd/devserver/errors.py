"""The one error type of the devserver: a status, a slug and a message for the caller."""

from __future__ import annotations


class ApiError(Exception):
    """A request the devserver refuses; becomes `{"error": {"code", "message"}}` with `status`."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(f"{status} {code}: {message}")
        self.status = status
        self.code = code
        self.message = message


def bad_request(message: str) -> ApiError:
    """Return a 400 `bad_request` error."""
    return ApiError(400, "bad_request", message)


def not_found(message: str) -> ApiError:
    """Return a 404 `not_found` error."""
    return ApiError(404, "not_found", message)
