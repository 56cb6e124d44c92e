"""The API document tells clients the truth: every status a route can answer, in the format it
answers it, and the request limits the settings set.

FastAPI documents the success response and its own 422; the rest is added here from the rules
of the middleware and the error mapping (one place, `service.http.errors`), so the document
cannot forget a status a route really sends.
"""

from __future__ import annotations

import warnings
from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic.json_schema import models_json_schema

from service.http.auth import PROTECTED
from service.http.middleware import PROBES
from service.http.schemas import OipInferRequest
from service.serving import ModelSet
from service.settings import Settings
from service.tasks import registry

WHY = {
    400: "malformed request: invalid JSON, a bad header or parameter",
    401: "API key missing or wrong (only when the server has keys)",
    403: "API key missing or wrong",
    404: "unknown model, version or file",
    408: "the request body did not arrive in time",
    413: "body, number of texts, characters or tokens above their limit",
    415: "Content-Type is neither JSON nor absent",
    422: "invalid field: the message names it and its allowed values",
    429: "busy: the queued work would not finish in time (see Retry-After)",
    503: "not ready, loading, unloaded, shutting down, or too many requests in flight (see Retry-After)",
    504: "the request's deadline passed",
}
ERROR = {"$ref": "#/components/schemas/ErrorResponse"}
OIP_ERROR = {"$ref": "#/components/schemas/OipError"}
LT_ERROR = {"$ref": "#/components/schemas/LibreTranslateError"}
SCHEMAS = {
    "OipError": {"type": "object", "required": ["error"], "properties": {"error": {"type": "string"}}},
    "LibreTranslateError": {"type": "object", "required": ["error"], "properties": {"error": {"type": "string"}}},
}
BODY_ERRORS = (400, 408, 413, 415, 422)
LT_TRANSLATE = {
    "type": "object",
    "required": ["q", "source", "target"],
    "properties": {
        "q": {
            "anyOf": [{"type": "string", "minLength": 1}, {"type": "array", "minItems": 1, "items": {"type": "string"}}]
        },
        "source": {"type": "string", "minLength": 1, "description": "a language code, or auto"},
        "target": {"type": "string", "minLength": 1},
        "format": {"type": "string", "enum": ["text", "html"], "default": "text"},
        "alternatives": {"type": "integer", "minimum": 0, "maximum": 3, "default": 0},
        "api_key": {"type": "string"},
    },
}


def needs_key(path: str) -> bool:
    """A route template that needs an API key when the server has keys."""
    return path in ("/predict", "/translate") or bool(
        PROTECTED.match(path.replace("{name}", "x").replace("{version}", "1"))
    )


def statuses(method: str, path: str, keys: bool) -> tuple[int, ...]:
    """The error statuses one operation can answer."""
    out: tuple[int, ...] = () if path in PROBES else (503,)  # beyond SERVE_MAX_IN_FLIGHT
    if path.startswith("/libretranslate/"):
        return out + (
            (400, 403, 429, 504) if path.endswith("/translate") else (400, 403) if method == "post" else (403,)
        )
    if method == "post":
        out += BODY_ERRORS
    infer = path in ("/predict", "/translate") or path.endswith("/infer")
    if keys and needs_key(path):
        out += (401,)
    if "{name}" in path or infer:
        out += (404,)
    if infer:
        out += (429, 503, 504)
    elif path in ("/readyz", "/v2/health/ready") or path.endswith("/ready") or "/figures/" in path:
        out += (503,)
    return tuple(sorted(set(out)))


def served(models: ModelSet) -> tuple[tuple[str, str, tuple[tuple[str, int], ...]], ...]:
    """What the document says of the models: each serving model's name, task and integer limits."""
    out = []
    for m in models.snapshot().serving():
        task = m.task
        if task is not None:
            limits = tuple(sorted((k, v) for k, v in task.describe().items() if type(v) is int))
            out.append((m.name, task.name, limits))
    return tuple(sorted(out))


def install(app: FastAPI, settings: Settings, models: ModelSet) -> None:
    """Replaces `app.openapi` with the complete document, rebuilt when the served models change."""
    keys = bool(settings.api_key_list)
    built: dict[str, Any] = {}

    def openapi() -> dict[str, Any]:
        now = served(models)
        if app.openapi_schema and built.get("models") == now:
            return app.openapi_schema
        built["models"] = now
        with warnings.catch_warnings():  # one route, two methods (LibreTranslate's languages): ids fixed below
            warnings.filterwarnings("ignore", "Duplicate Operation ID")
            doc = get_openapi(title=app.title, version=app.version, summary=app.summary, routes=app.routes)
        doc.setdefault("components", {}).setdefault("schemas", {}).update(SCHEMAS)
        # the OIP infer body is parsed by hand (JSON or binary tensors); its model is documented here
        _, defs = models_json_schema([(OipInferRequest, "validation")], ref_template="#/components/schemas/{model}")
        doc["components"]["schemas"].update(defs["$defs"])
        tensor = doc["components"]["schemas"]["OipTensor"]  # a JSON body carries its data (binary: docs/serving.md)
        tensor["required"] = [*tensor["required"], "data"]
        tensor["properties"]["data"] = {"type": "array", "items": {"type": "string"}, "description": "one text per row"}
        for path, operations in doc["paths"].items():
            for method, op in operations.items():
                op["operationId"] = f"{op.get('operationId', path)}_{method}".replace("_post_post", "_post")
                shape = (
                    LT_ERROR if path.startswith("/libretranslate/") else OIP_ERROR if path.startswith("/v2") else ERROR
                )
                for code in statuses(method, path, keys):
                    op["responses"].setdefault(
                        str(code), {"description": WHY[code], "content": {"application/json": {"schema": shape}}}
                    )
                if op["responses"].get("422") and shape is not ERROR:  # FastAPI's own 422 shape is replaced
                    op["responses"]["422"]["content"]["application/json"]["schema"] = shape
                if path == "/libretranslate/translate":
                    op["requestBody"] = {
                        "required": True,
                        "content": {
                            "application/json": {"schema": LT_TRANSLATE},
                            "application/x-www-form-urlencoded": {"schema": LT_TRANSLATE},
                        },
                    }
        _limits(doc, settings)
        _models(doc, now)
        app.openapi_schema = doc
        return doc

    app.openapi = openapi  # type: ignore[method-assign]


def _limits(doc: dict[str, Any], settings: Settings) -> None:
    """`texts` of every task request: at most max_texts items of at most max_text_chars characters."""
    for schema in doc["components"]["schemas"].values():
        texts = schema.get("properties", {}).get("texts")
        if texts and texts.get("type") == "array":
            texts["maxItems"] = settings.max_texts
            texts.setdefault("items", {})["maxLength"] = settings.max_text_chars


def _models(doc: dict[str, Any], now: tuple[tuple[str, str, tuple[tuple[str, int], ...]], ...]) -> None:
    """Each task request names the models serving that task, a field that is also one of the
    models' limits (`max_new_tokens`) is bounded by the largest of them, and a model's `{name}`
    in a path names a served model (the repository API also names models that are not)."""
    for path, operations in doc["paths"].items():
        for op in operations.values():
            for param in op.get("parameters", []):
                if path.startswith("/v2/models/") and param["in"] == "path" and param["name"] == "name" and now:
                    param["schema"] = {"type": "string", "enum": [name for name, _, _ in now]}
    schemas = doc["components"]["schemas"]
    for cls in registry.tasks():
        props = schemas.get(cls.Request.__name__, {}).get("properties", {})
        mine = [(name, dict(limits)) for name, task, limits in now if task == cls.name]
        if not mine:
            continue
        props["model"] = {
            "anyOf": [{"type": "string", "enum": [name for name, _ in mine]}, {"type": "null"}],
            "description": props.get("model", {}).get("description", ""),
        }
        for field, prop in props.items():
            bounds = [limits[field] for _, limits in mine if field in limits]
            for branch in prop.get("anyOf", [prop]):
                if bounds and branch.get("type") == "integer":
                    branch["maximum"] = min(branch.get("maximum", max(bounds)), max(bounds))
