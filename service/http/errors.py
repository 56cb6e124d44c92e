"""Every error answer of the service: one JSON shape, the status from `errors.HTTP_STATUS`.

REST endpoints answer ``{"error": "<message>", "type": "<kind>"}``; the Open Inference Protocol
endpoints (``/v2...``) answer ``{"error": "<message>"}`` as that protocol says. FastAPI's
``{"detail": ...}`` bodies are replaced. Messages never echo request values, and the JSON is
ASCII-escaped, so odd input (lone surrogates) cannot break an error answer.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException
from starlette.responses import JSONResponse, Response

from service.errors import RETRY_AFTER_S, ServiceError, http_status
from service.schemas import DecodeOptions, OipInferRequest, PredictRequest, TranslateRequest, field_rules

log = logging.getLogger(__name__)

FIELD_RULES = field_rules(PredictRequest, TranslateRequest, DecodeOptions, OipInferRequest)
HTTP_KINDS = {400: "bad_request", 404: "not_found", 405: "method_not_allowed", 413: "payload_too_large"}
MAX_LISTED_ERRORS = 3


class AsciiJSONResponse(JSONResponse):
    def render(self, content: Any) -> bytes:
        return json.dumps(content, ensure_ascii=True, allow_nan=False, separators=(",", ":")).encode("ascii")


def error_response(path: str, message: str, kind: str, status: int | None = None) -> Response:
    status = status or http_status(kind)
    body: dict[str, str] = {"error": message}
    if not path.startswith("/v2"):
        body["type"] = kind
    headers = {"Retry-After": str(RETRY_AFTER_S[kind])} if kind in RETRY_AFTER_S else None
    return AsciiJSONResponse(body, status_code=status, headers=headers)


def describe_validation(errors: Sequence[Mapping[str, Any]], prefix: str = "") -> str:
    """'beam_size: Input should be less than or equal to 8 (allowed: an integer from 1 to 8)'."""
    parts = []
    for err in errors[:MAX_LISTED_ERRORS]:
        loc = [p for p in err.get("loc", ()) if p != "body"]
        where = (prefix + _path(loc)).rstrip(".") or "body"
        msg = str(err.get("msg", "invalid value"))
        if err.get("type") in ("model_attributes_type", "dict_type", "model_type") and not loc:
            msg = "must be a JSON object"
        elif err.get("type") == "missing" and not loc:
            msg = "missing: send a JSON object"
        rule = FIELD_RULES.get(str(loc[0])) if len(loc) == 1 else None
        parts.append(f"{where}: {msg}" + (f" (allowed: {rule})" if rule else ""))
    more = len(errors) - MAX_LISTED_ERRORS
    return "; ".join(parts) + (f"; and {more} more" if more > 0 else "")


def _path(loc: Sequence[Any]) -> str:
    out = ""
    for p in loc:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
    return out


async def _service_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, ServiceError)
    return error_response(request.url.path, str(exc) or exc.kind, exc.kind)


async def _validation_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, RequestValidationError)
    errors = exc.errors()
    if errors and errors[0].get("type") == "json_invalid":
        detail = (errors[0].get("ctx") or {}).get("error", "malformed")
        pos = errors[0].get("loc", ("body", "?"))[-1]
        return error_response(request.url.path, f"invalid JSON at position {pos}: {detail}", "invalid_json")
    return error_response(request.url.path, describe_validation(errors), "invalid_input")


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    kind = HTTP_KINDS.get(exc.status_code, "error")
    message = exc.detail if isinstance(exc.detail, str) else kind
    response = error_response(request.url.path, message, kind, exc.status_code)
    if exc.headers:
        response.headers.update(exc.headers)
    return response


def install(app: FastAPI) -> None:
    app.add_exception_handler(ServiceError, _service_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(HTTPException, _http_error)
