"""Every error answer of the service: each protocol's error body, and the kinds only HTTP has.

An error kind is a `ServiceError` class, declared once with its status and Retry-After (the
domain's in `service.errors`, the HTTP layer's below). REST routes answer
``{"error": "<message>", "type": "<kind>"}``; the Open Inference Protocol and the LibreTranslate
API answer ``{"error": "<message>"}`` as they say, LibreTranslate with its own codes
(`Protocol.status`: every client error is a 400, a key problem a 403); the OpenAI-compatible
routes ``{"error": {"message", "type", "param", "code"}}`` (the kind is the code). Which applies is the
route's declared protocol (`service.http.table.Route.protocol`). Messages never echo request
values, and the JSON is ASCII-escaped, so odd input (lone surrogates) cannot break an error answer.
"""

from __future__ import annotations

import json
from typing import Any

from starlette.responses import JSONResponse, Response

from service.errors import ServiceError
from service.http.table import Protocol


class Unauthorized(ServiceError):
    """No valid key where one is needed (answered with `WWW-Authenticate`)."""

    kind = "unauthorized"
    status = 401


class Forbidden(ServiceError):
    """A key that may not do this, or something this server does not do."""

    kind = "forbidden"
    status = 403


class NotFound(ServiceError):
    """No such thing at this path (a route, a file, a figure); unknown models are `ModelNotFound`."""

    kind = "not_found"
    status = 404


class MethodNotAllowed(ServiceError):
    kind = "method_not_allowed"
    status = 405


class RequestTimeout(ServiceError):
    """The body did not arrive in time."""

    kind = "request_timeout"
    status = 408


class HeadersTooLarge(ServiceError):
    """Request headers above the server's limit: refused by the server's protocol, before any app."""

    kind = "headers_too_large"
    status = 431


class UnsupportedMediaType(ServiceError):
    kind = "unsupported_media_type"
    status = 415


class Overloaded(ServiceError):
    """Too many requests in flight: refused before the body is read."""

    kind = "overloaded"
    status = 503
    retry_after = 1


class InternalError(ServiceError):
    """A bug: logged, answered without its details."""

    kind = "internal_error"
    status = 500


class AsciiJSONResponse(JSONResponse):
    def render(self, content: Any) -> bytes:
        return json.dumps(content, ensure_ascii=True, allow_nan=False, separators=(",", ":")).encode("ascii")


def error_body(protocol: Protocol, exc: ServiceError) -> dict[str, object]:
    """`exc` as `protocol`'s error body (also a stream's error event)."""
    message = str(exc) or exc.kind
    if protocol is Protocol.OPENAI:
        kind = _OPENAI_TYPES.get(exc.status, "server_error" if exc.status >= 500 else "invalid_request_error")
        return {"error": {"message": message, "type": kind, "param": None, "code": exc.kind}}
    if protocol is Protocol.REST:
        return {"error": message, "type": exc.kind}
    return {"error": message}


_OPENAI_TYPES = {401: "authentication_error", 403: "permission_error", 404: "not_found_error", 429: "rate_limit_error"}
"""OpenAI's error types by status (its API reference); the project's kind is the error's `code`."""


def answer_error(protocol: Protocol, exc: ServiceError) -> Response:
    """`exc` as `protocol` answers it: its body, its status, and Retry-After where the kind has one."""
    headers = {"Retry-After": str(exc.retry_after)} if exc.retry_after else None
    return AsciiJSONResponse(error_body(protocol, exc), status_code=protocol.status(exc.status), headers=headers)
