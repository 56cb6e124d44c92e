"""Domain errors raised by the engine, the schedulers and the tasks. Nothing here knows HTTP:
`service.http.errors` maps each `kind` to a status code."""

from __future__ import annotations


class ServiceError(Exception):
    """Base class: `kind` is the machine-readable error type clients see; `retry_after` (seconds),
    when set, tells a client when trying again makes sense."""

    kind = "error"
    retry_after: int | None = None


class InputTooLong(ServiceError):
    kind = "input_too_long"


class InvalidInput(ServiceError):
    kind = "invalid_input"


class InvalidJson(ServiceError):
    """A body that is not JSON where JSON is expected."""

    kind = "invalid_json"


class UnreadableBody(ServiceError):
    """A body that cannot be read as text at all (not UTF-8, nested too deeply)."""

    kind = "bad_request"


class InvalidDocument(ServiceError):
    """An uploaded file its format cannot read (syntax, bytes its charset does not allow, an
    unknown extension): the message names the line where known."""

    kind = "invalid_document"


class ModelNotFound(ServiceError):
    kind = "model_not_found"


class QueueFull(ServiceError):
    kind = "queue_full"


class RateLimited(ServiceError):
    """A client over one of its per-minute limits (`service.http.limits`): retrying after
    `retry_after` seconds fits; `limit` names the limit (a metric label, never the client)."""

    kind = "rate_limited"

    def __init__(self, message: str, retry_after: int, limit: str) -> None:
        super().__init__(message)
        self.retry_after, self.limit = retry_after, limit


class LoadRefused(ServiceError):
    """A model `load` found nothing it could serve: the store's state is at fault, not the request
    (409: the same request may succeed once the folder is fixed)."""

    kind = "load_refused"


class NotReady(ServiceError):
    kind = "not_ready"


class DeadlineExceeded(ServiceError):
    kind = "deadline_exceeded"


class PayloadTooLarge(ServiceError):
    """The request as a whole is too large: body bytes or number of texts."""

    kind = "payload_too_large"


class ShuttingDown(NotReady):
    kind = "shutting_down"
