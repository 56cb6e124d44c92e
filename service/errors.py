"""Domain errors raised by the engine and the batcher; the HTTP layer maps each to one status."""

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
