"""Every error answer of the service: the one mapping of error kinds to statuses, and each
protocol's error body.

REST routes answer ``{"error": "<message>", "type": "<kind>"}``; the Open Inference Protocol and
the LibreTranslate API answer ``{"error": "<message>"}`` as they say, LibreTranslate with its own
codes (every client error is a 400, a missing key a 403). Which applies is the route's declared
protocol (`service.http.table.Route.protocol`). Messages never echo request values, and the JSON
is ASCII-escaped, so odd input (lone surrogates) cannot break an error answer.
"""

from __future__ import annotations

import json
from typing import Any

from starlette.responses import JSONResponse, Response

from service.errors import (
    DeadlineExceeded,
    InputTooLong,
    InvalidDocument,
    InvalidInput,
    InvalidJson,
    LoadRefused,
    ModelNotFound,
    NotReady,
    PayloadTooLarge,
    QueueFull,
    RateLimited,
    ServiceError,
    ShuttingDown,
)
from service.http.table import Protocol

HTTP_STATUS: dict[str, int] = {
    InvalidJson.kind: 400,
    InvalidDocument.kind: 400,
    "bad_request": 400,
    "unauthorized": 401,
    "forbidden": 403,
    "not_found": 404,
    "method_not_allowed": 405,
    "request_timeout": 408,
    "unsupported_media_type": 415,
    InvalidInput.kind: 422,
    LoadRefused.kind: 409,
    InputTooLong.kind: 413,
    PayloadTooLarge.kind: 413,
    ModelNotFound.kind: 404,
    QueueFull.kind: 429,
    RateLimited.kind: 429,
    NotReady.kind: 503,
    ShuttingDown.kind: 503,
    DeadlineExceeded.kind: 504,
    "internal_error": 500,
    "overloaded": 503,
}

RETRY_AFTER_S: dict[str, int] = {QueueFull.kind: 1, NotReady.kind: 5, ShuttingDown.kind: 5, "overloaded": 1}
"""`Retry-After` seconds sent with these kinds."""

LT_FOLDED = {401: 403, 404: 400, 413: 400, 415: 400, 422: 400}
"""LibreTranslate's codes: a bad request of any sort is a 400, a key problem a 403."""


class Forbidden(ServiceError):
    kind = "forbidden"


class NotFound(ServiceError):
    """No such thing at this path (a file, a figure); unknown models are `ModelNotFound`."""

    kind = "not_found"


def status_of(protocol: Protocol, kind: str) -> int:
    status = HTTP_STATUS.get(kind, 500)
    return LT_FOLDED.get(status, status) if protocol is Protocol.LIBRETRANSLATE else status


class AsciiJSONResponse(JSONResponse):
    def render(self, content: Any) -> bytes:
        return json.dumps(content, ensure_ascii=True, allow_nan=False, separators=(",", ":")).encode("ascii")


def error_response(protocol: Protocol, message: str, kind: str, retry_after: int | None = None) -> Response:
    body: dict[str, str] = {"error": message}
    if protocol is Protocol.REST:
        body["type"] = kind
    retry_after = retry_after or RETRY_AFTER_S.get(kind)
    headers = {"Retry-After": str(retry_after)} if retry_after else None
    return AsciiJSONResponse(body, status_code=status_of(protocol, kind), headers=headers)


def answer_error(protocol: Protocol, exc: ServiceError) -> Response:
    return error_response(protocol, str(exc) or exc.kind, exc.kind, exc.retry_after)
