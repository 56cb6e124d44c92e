"""Domain errors raised by the engine and the batcher; the HTTP layer maps each to one status.

`HTTP_STATUS` is that one mapping (kind -> status code); the service's exception handlers and
middleware use it for every error answer.
"""

from __future__ import annotations


class ServiceError(Exception):
    """Base class: `kind` is the machine-readable error type clients see."""

    kind = "error"


class InputTooLong(ServiceError):
    kind = "input_too_long"


class InvalidInput(ServiceError):
    kind = "invalid_input"


class ModelNotFound(ServiceError):
    kind = "model_not_found"


class QueueFull(ServiceError):
    kind = "queue_full"


class NotReady(ServiceError):
    kind = "not_ready"


class DeadlineExceeded(ServiceError):
    kind = "deadline_exceeded"


class PayloadTooLarge(ServiceError):
    """The request as a whole is too large: body bytes or number of texts."""

    kind = "payload_too_large"


class ShuttingDown(NotReady):
    kind = "shutting_down"


HTTP_STATUS: dict[str, int] = {
    "invalid_json": 400,
    "bad_request": 400,
    "not_found": 404,
    "method_not_allowed": 405,
    "unsupported_media_type": 415,
    InvalidInput.kind: 422,
    InputTooLong.kind: 413,
    PayloadTooLarge.kind: 413,
    ModelNotFound.kind: 404,
    QueueFull.kind: 429,
    NotReady.kind: 503,
    ShuttingDown.kind: 503,
    DeadlineExceeded.kind: 504,
    "internal_error": 500,
}

RETRY_AFTER_S: dict[str, int] = {QueueFull.kind: 1, NotReady.kind: 5, ShuttingDown.kind: 5}
"""`Retry-After` seconds sent with these kinds."""


def http_status(kind: str) -> int:
    return HTTP_STATUS.get(kind, 500)
