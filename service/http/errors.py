"""Every error answer of the service: one JSON shape, and the one mapping of error kinds to HTTP status.

REST endpoints answer ``{"error": "<message>", "type": "<kind>"}``; the Open Inference Protocol
endpoints (``/v2...``) answer ``{"error": "<message>"}`` as that protocol says. FastAPI's
``{"detail": ...}`` bodies are replaced. Messages never echo request values, and the JSON is
ASCII-escaped, so odd input (lone surrogates) cannot break an error answer.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException
from starlette.responses import JSONResponse, Response

from service.errors import (
    DeadlineExceeded,
    InputTooLong,
    InvalidInput,
    InvalidJson,
    ModelNotFound,
    NotReady,
    PayloadTooLarge,
    QueueFull,
    ServiceError,
    ShuttingDown,
)
from service.validation import describe_validation

HTTP_STATUS: dict[str, int] = {
    InvalidJson.kind: 400,
    "bad_request": 400,
    "unauthorized": 401,
    "not_found": 404,
    "method_not_allowed": 405,
    "request_timeout": 408,
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
    "overloaded": 503,
}

RETRY_AFTER_S: dict[str, int] = {QueueFull.kind: 1, NotReady.kind: 5, ShuttingDown.kind: 5, "overloaded": 1}
"""`Retry-After` seconds sent with these kinds."""

HTTP_KINDS = {400: "bad_request", 404: "not_found", 405: "method_not_allowed", 413: "payload_too_large"}


def http_status(kind: str) -> int:
    return HTTP_STATUS.get(kind, 500)


class AsciiJSONResponse(JSONResponse):
    def render(self, content: Any) -> bytes:
        return json.dumps(content, ensure_ascii=True, allow_nan=False, separators=(",", ":")).encode("ascii")


def error_response(
    path: str, message: str, kind: str, status: int | None = None, retry_after: int | None = None
) -> Response:
    status = status or http_status(kind)
    body: dict[str, str] = {"error": message}
    if not path.startswith("/v2"):
        body["type"] = kind
    retry_after = retry_after or RETRY_AFTER_S.get(kind)
    headers = {"Retry-After": str(retry_after)} if retry_after else None
    return AsciiJSONResponse(body, status_code=status, headers=headers)


def install(app: FastAPI, rules: Mapping[str, str]) -> None:
    """Error handlers for domain errors, validation errors (messages with `rules`) and HTTP errors."""

    async def service_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, ServiceError)
        return error_response(request.url.path, str(exc) or exc.kind, exc.kind, retry_after=exc.retry_after)

    async def validation_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, RequestValidationError)
        errors = exc.errors()
        if errors and errors[0].get("type") == "json_invalid":
            detail = (errors[0].get("ctx") or {}).get("error", "malformed")
            pos = errors[0].get("loc", ("body", "?"))[-1]
            return error_response(request.url.path, f"invalid JSON at position {pos}: {detail}", "invalid_json")
        return error_response(request.url.path, describe_validation(errors, rules), "invalid_input")

    async def http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        kind = HTTP_KINDS.get(exc.status_code, "error")
        message = exc.detail if isinstance(exc.detail, str) else kind
        response = error_response(request.url.path, message, kind, exc.status_code)
        if exc.headers:
            response.headers.update(exc.headers)
        return response

    async def internal_error(request: Request, exc: Exception) -> Response:
        # FastAPI's outermost layer answers with this and re-raises: `RequestContext` logs it
        return error_response(request.url.path, "internal server error", "internal_error")

    app.add_exception_handler(Exception, internal_error)
    app.add_exception_handler(ServiceError, service_error)
    app.add_exception_handler(RequestValidationError, validation_error)
    app.add_exception_handler(HTTPException, http_error)
