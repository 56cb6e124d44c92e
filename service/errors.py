"""Domain errors raised by the engine, the schedulers and the tasks, each declared once: its
`kind` (what clients see), the status that answers it and, where one fits, when to retry.
Nothing here imports HTTP; `service.http.errors` renders an error in a route's protocol (and
LibreTranslate folds the statuses, `service.http.table.Protocol.status`)."""

from __future__ import annotations


class ServiceError(Exception):
    """Base class: `kind` is the machine-readable error type clients see, `status` the HTTP status
    that answers it; `retry_after` (seconds), when set, tells a client when trying again makes sense."""

    kind = "error"
    status = 500
    retry_after: int | None = None


class InputTooLong(ServiceError):
    kind = "input_too_long"
    status = 413


class InvalidInput(ServiceError):
    kind = "invalid_input"
    status = 422


class InvalidJson(ServiceError):
    """A body that is not JSON where JSON is expected."""

    kind = "invalid_json"
    status = 400


class BadRequest(ServiceError):
    """A request that cannot be read at all (its framing, its headers)."""

    kind = "bad_request"
    status = 400


class UnreadableBody(BadRequest):
    """A body that cannot be read as text at all (not UTF-8, nested too deeply)."""


class InvalidDocument(ServiceError):
    """An uploaded file its format cannot read (syntax, bytes its charset does not allow, an
    unknown extension): the message names the line where known."""

    kind = "invalid_document"
    status = 400


class ModelNotFound(ServiceError):
    kind = "model_not_found"
    status = 404


class QueueFull(ServiceError):
    kind = "queue_full"
    status = 429
    retry_after = 1


class RateLimited(ServiceError):
    """A client over one of its per-minute limits (`service.http.limits`): retrying after
    `retry_after` seconds fits; `limit` names the limit (a metric label, never the client)."""

    kind = "rate_limited"
    status = 429

    def __init__(self, message: str, retry_after: int, limit: str) -> None:
        super().__init__(message)
        self.retry_after, self.limit = retry_after, limit


class LoadRefused(ServiceError):
    """A model `load` found nothing it could serve: the store's state is at fault, not the request
    (409: the same request may succeed once the folder is fixed)."""

    kind = "load_refused"
    status = 409


class NotReady(ServiceError):
    kind = "not_ready"
    status = 503
    retry_after = 5


class DeadlineExceeded(ServiceError):
    kind = "deadline_exceeded"
    status = 504


class PayloadTooLarge(ServiceError):
    """The request as a whole is too large: body bytes or number of texts."""

    kind = "payload_too_large"
    status = 413


class ShuttingDown(NotReady):
    kind = "shutting_down"
