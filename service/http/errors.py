"""Every error answer of the service: each protocol's error body, and the kinds only HTTP has.

An error kind is a `ServiceError` class, declared once with its status and Retry-After (the
domain's in `service.errors`, the HTTP layer's below). REST routes answer
``{"error": "<message>", "type": "<kind>"}``; the Open Inference Protocol and the LibreTranslate
API answer ``{"error": "<message>"}`` as they say, LibreTranslate with its own codes
(`Protocol.status`: every client error is a 400, a key problem a 403). Which applies is the
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


def answer_error(protocol: Protocol, exc: ServiceError) -> Response:
    """`exc` as `protocol` answers it: its body, its status, and Retry-After where the kind has one."""
    body: dict[str, str] = {"error": str(exc) or exc.kind}
    if protocol is Protocol.REST:
        body["type"] = exc.kind
    headers = {"Retry-After": str(exc.retry_after)} if exc.retry_after else None
    return AsciiJSONResponse(body, status_code=protocol.status(exc.status), headers=headers)
