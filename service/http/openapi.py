"""The API document, generated from the route table: the document and the dispatcher read the
same declarations, so the document cannot list a route that is not served, miss one that is, or
forget a status a route really sends.

Each declared route gives its operations: path parameters from its template, the request body's
and the answer's models (JSON Schema by pydantic), and every error status `Route.statuses` says
it can answer, in its protocol's error shape. The request limits the settings set and the models
being served are written in at serving time, and the document is rebuilt when those change.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

from pydantic import BaseModel
from pydantic.json_schema import models_json_schema
from starlette.types import ASGIApp

from service.http.auth import KeyRing
from service.http.dispatch import json_answer
from service.http.schemas import text_limits
from service.http.scope import Call
from service.http.table import Access, Protocol, Route, Served, path_params
from service.serving import ModelSet
from service.settings import Settings
from service.tasks import registry

WHY = {
    400: "malformed request: invalid JSON, a bad header or parameter",
    401: "API key missing or unknown (only when the server has keys this route takes)",
    403: "a key of another role, model control turned off, or (LibreTranslate) a key missing or wrong",
    404: "unknown model, version or file",
    408: "the request body did not arrive in time",
    409: "the store holds no version of the model that can be loaded (the message says why)",
    413: "the body, a text's tokens, or a client's characters per request or minute above their limit",
    415: "Content-Type is neither JSON nor absent",
    422: "invalid field, or more texts or characters than the document allows: the message names it and the limit",
    429: "busy: the request would not finish in time at its turn, or its client is over a limit (see Retry-After)",
    503: "not ready, loading, unloaded, shutting down, or too many requests in flight (see Retry-After)",
    504: "the request's deadline passed",
}
ERROR_SCHEMAS: dict[Protocol, tuple[str, dict[str, Any]]] = {
    Protocol.REST: (
        "ErrorResponse",
        {
            "type": "object",
            "required": ["error", "type"],
            "properties": {"error": {"type": "string"}, "type": {"type": "string"}},
        },
    ),
    Protocol.OIP: ("OipError", {"type": "object", "required": ["error"], "properties": {"error": {"type": "string"}}}),
    Protocol.LIBRETRANSLATE: (
        "LibreTranslateError",
        {"type": "object", "required": ["error"], "properties": {"error": {"type": "string"}}},
    ),
    Protocol.OPENAI: (
        "OpenAIError",
        {
            "type": "object",
            "required": ["error"],
            "properties": {
                "error": {
                    "type": "object",
                    "required": ["message", "type", "param", "code"],
                    "properties": {
                        "message": {"type": "string"},
                        "type": {"type": "string"},
                        "param": {"type": ["string", "null"]},
                        "code": {"type": ["string", "null"]},
                    },
                }
            },
        },
    ),
}
TITLE = "transformer-serve"
_REF = "#/components/schemas/{model}"


def document(routes: tuple[Route, ...], settings: Settings, served: Served) -> dict[str, Any]:
    """The OpenAPI 3.1 document of the documented routes, for these settings and served models."""
    access = KeyRing.of(settings).access
    shown = [r for r in routes if r.documented]
    models: list[tuple[type[BaseModel], Any]] = []
    for r in shown:
        if r.body is not None:
            models.append((r.body, "validation"))
        if r.response is not None:
            models.append((r.response, "serialization"))
    names, defs = models_json_schema(list(dict.fromkeys(models)), ref_template=_REF)
    schemas: dict[str, Any] = dict(defs.get("$defs", {}))
    schemas |= {name: schema for name, schema in ERROR_SCHEMAS.values()}
    paths: dict[str, dict[str, Any]] = {}
    for r in shown:
        for method in r.methods:
            op = _operation(r, method, access, names, [name for name, _, _, _ in served])
            if r.doc_served is not None:
                op |= r.doc_served(settings, served)
            for path, one in _per_model(r, op, schemas, served):
                paths.setdefault(path, {})[method.lower()] = one
    doc: dict[str, Any] = {
        "openapi": "3.1.0",
        "info": {
            "title": TITLE,
            "summary": "Transformer text models (classification, translation) over ONNX Runtime",
            "version": "0.1.0",
        },
        "paths": paths,
        "components": {"schemas": schemas, "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}}},
    }
    _limits(doc, settings)
    _models(doc, served)
    return doc


def _per_model(
    r: Route, op: dict[str, Any], schemas: dict[str, Any], served: Served
) -> list[tuple[str, dict[str, Any]]]:
    """The route's operations: one at its template, or (`Route.doc_model`) one per served model at
    that model's own path, where the body can say what this model takes, which a request body
    shared by every `{name}` cannot."""
    if r.doc_model is None or not served:
        return [(r.path, op)]
    out = []
    for model in served:
        one = copy.deepcopy(op)
        one["operationId"] = f"{op['operationId']}_{model[0]}"
        params = [p for p in one.pop("parameters", []) if p["name"] != "name"]
        if params:
            one["parameters"] = params
        out.append((r.path.replace("{name}", model[0]), one | dict(r.doc_model(schemas, model))))
    return out


def _param_schema(r: Route, param: str, served: list[str]) -> dict[str, Any]:
    """A path parameter's schema: a version is an integer; a `{name}` the route declares as a
    served model's is one of those (the repository API also names models that are not)."""
    if param == "version":  # digits, as `Call.version` reads them
        return {"type": "integer", "minimum": 0, "title": "Version"}
    if param == "name" and r.names_served_model and served:
        return {"type": "string", "enum": served}
    return {"type": "string", "title": param.title()}


def _operation(
    r: Route, method: str, access: Access, names: dict[Any, dict[str, str]], served: list[str]
) -> dict[str, Any]:
    op: dict[str, Any] = {"operationId": r.name if len(r.methods) == 1 else f"{r.name}_{method.lower()}"}
    if r.summary:
        op["summary"] = r.summary
    if r.description:
        op["description"] = " ".join(r.description.split())
    params = path_params(r.path)
    if params:
        op["parameters"] = [
            {"name": p, "in": "path", "required": True, "schema": _param_schema(r, p, served)} for p in params
        ]
    if r.body is not None:
        op["requestBody"] = {
            "required": True,
            "content": {"application/json": {"schema": names[(r.body, "validation")]}},
        }
    ok = names[(r.response, "serialization")] if r.response is not None else {}
    content = {t: {"schema": ok} for t in (r.media_type, *r.media_types)}
    if r.events:
        content[EVENT_STREAM] = {"schema": _event(" ".join(r.events.split()))}
    op["responses"] = {"200": {"description": "Successful Response", "content": content}}
    shape = {"$ref": _REF.format(model=ERROR_SCHEMAS[r.protocol][0])}
    if 401 in access.statuses(r.auth):  # a bearer key is asked for
        op["security"] = [{"bearer": []}]
    for code in r.statuses(method, access):
        op["responses"][str(code)] = {"description": WHY[code], "content": {"application/json": {"schema": shape}}}
    op |= r.doc_extra
    return op


EVENT_STREAM = "text/event-stream"


def _event(description: str) -> dict[str, Any]:
    """One Server-Sent Event as OpenAPI 3.1 describes a `text/event-stream` item (its `schema`
    read per event, as schemathesis and 3.2's `itemSchema` read it): `data` a JSON text, but for
    the last event's `[DONE]`."""
    return {
        "type": "object",
        "required": ["data"],
        "properties": {
            "data": {"type": "string", "contentMediaType": "application/json", "description": description},
            "event": {"type": "string"},
            "id": {"type": "string"},
            "retry": {"type": "integer", "minimum": 0},
        },
    }


TEXT_LISTS = {"OipTensor": "data"}
"""Request bodies whose list of texts is not called `texts`."""


def _limits(doc: dict[str, Any], settings: Settings) -> None:
    """The texts of every task request and of the OIP tensor, bounded by the settings."""
    for name, schema in doc["components"]["schemas"].items():
        texts = schema.get("properties", {}).get(TEXT_LISTS.get(name, "texts"))
        if texts and texts.get("type") == "array":
            text_limits(texts, settings.max_texts, settings.max_text_chars)
        pairs = schema.get("properties", {}).get("pairs")
        if pairs and pairs.get("type") == "array":
            pairs["maxItems"] = settings.max_texts  # a pair counts as one text


def _models(doc: dict[str, Any], now: Served) -> None:
    """Each task request names the models serving that task; a field that is also one of the
    models' limits (`max_new_tokens`) is bounded by the largest of them, and a field whose values
    the models list (`source_language`) takes one of those they list."""
    schemas = doc["components"]["schemas"]
    for cls in registry.tasks():
        props = schemas.get(cls.Request.__name__, {}).get("properties", {})
        mine = [(name, dict(limits)) for name, task, limits, _ in now if task == cls.name]
        lists = [dict(choices) for _, task, _, choices in now if task == cls.name]
        if not mine:  # no model of the task is served: a request can only name none (and get a 404)
            if "model" in props:
                props["model"] = {"type": "null", "description": f"no {cls.name} model is served now"}
            continue
        props["model"] = {
            "anyOf": [{"type": "string", "enum": [name for name, _ in mine]}, {"type": "null"}],
            "description": props.get("model", {}).get("description", ""),
        }
        for field, prop in props.items():
            bounds = [limits[field] for _, limits in mine if field in limits]
            values = sorted({v for choices in lists for v in choices.get(f"{field}s", ())})
            for branch in prop.get("anyOf", [prop]):
                if bounds and branch.get("type") == "integer":
                    branch["maximum"] = min(branch.get("maximum", max(bounds)), max(bounds))
                if values and branch.get("type") == "string":
                    branch["enum"] = values


def served(models: ModelSet) -> Served:
    """What the document says of the models: each serving model's name, task and integer limits."""
    out = []
    for v in models.snapshot().serving():
        if v.task is not None:
            d = v.task.describe()
            limits = tuple(sorted((k, x) for k, x in d.items() if type(x) is int))
            lists = tuple(sorted((k, tuple(map(str, x))) for k, x in d.items() if isinstance(x, list) and x))
            lists += (("outputs", tuple(t.name for t in v.task.outputs())),)  # its OIP outputs
            out.append((v.name, v.task.name, limits, lists))
    return tuple(sorted(out))


def builder(routes: tuple[Route, ...], settings: Settings, models: ModelSet) -> Callable[[], dict[str, Any]]:
    """The document for what is served now, built again only when that changed."""
    built: dict[str, Any] = {}

    def openapi() -> dict[str, Any]:
        now = served(models)
        if built.get("models") != now or "doc" not in built:
            built["models"], built["doc"] = now, document(routes, settings, now)
        doc: dict[str, Any] = built["doc"]
        return doc

    return openapi


def routes(openapi: Callable[[], dict[str, Any]]) -> list[Route]:
    """The document itself (the pages that show it: `service.http.apidocs`)."""

    async def openapi_json(call: Call) -> ASGIApp:
        return json_answer(openapi())

    return [
        Route("/openapi.json", ("GET",), openapi_json, "openapi", documented=False),
    ]
