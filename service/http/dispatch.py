"""The one request path: match the route table once, run the middleware, call the route's handler.

`Router` is the outermost ASGI layer: it matches the request against the table and leaves the
`Match` in the scope, where the middleware reads the route's declared rules (probe, key, body
types, metric label). `Endpoint` is the innermost: it calls the matched route's handler with a
`Call` and turns a domain error into the route's protocol's error answer; a path no route has is
a 404, a method the path does not take a 405. Why not FastAPI's routing: with one text per
request its per-request layers (matching every route, dependency solving, exit stacks,
re-validating the answer) cost the event loop more CPU than the request's own work (py-spy under
`wrk`); here a request costs one dict lookup or one regex, and a handler parses its body once.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar
from urllib.parse import parse_qs

from pydantic import BaseModel, ValidationError
from starlette.types import ASGIApp, Receive, Scope, Send

from service.errors import InvalidInput, InvalidJson, ServiceError, ShuttingDown, UnreadableBody
from service.http.errors import answer_error, error_response
from service.http.limits import hold
from service.http.middleware import RequestInfo, header, request_info
from service.http.schemas import load_json
from service.http.state import AppState, scope_state
from service.http.table import MATCH_KEY, Auth, Protocol, Route, RouteTable, matched, reads_body
from service.validation import describe_validation

M = TypeVar("M", bound=BaseModel)

JSON_HEADERS = [(b"content-type", b"application/json")]
UNREADABLE = "There was an error parsing the body"
MISSING = {"type": "missing", "loc": (), "msg": "Field required"}  # an empty body


@dataclass(slots=True)
class Call:
    """One request as a handler sees it: the route, the path's parameters, the body as received."""

    scope: Scope
    route: Route
    params: Mapping[str, str]
    body: bytes

    @property
    def state(self) -> AppState:
        return scope_state(self.scope)

    @property
    def info(self) -> RequestInfo:
        return request_info(self.scope)

    def header(self, name: bytes) -> str | None:
        return header(self.scope, name)

    def query(self) -> dict[str, Any]:
        """The query string; a repeated key is a list."""
        raw = self.scope.get("query_string", b"").decode("latin-1")
        return {k: v[0] if len(v) == 1 else v for k, v in parse_qs(raw).items()}

    def admit(self, timeout_s: float | None = None) -> tuple[AppState, float]:
        """The app state and this request's deadline (`timeout_s` from its arrival, else the
        settings' request timeout); 503 once the service closes (after SIGTERM's grace)."""
        state = self.state
        if state.closing:
            raise ShuttingDown("the service is shutting down; retry on another instance")
        return state, self.info.start + (timeout_s or state.settings.request_timeout_s)

    def charge(self, texts: Sequence[str]) -> None:
        """Charges the client for the texts it submits (per-client limits: 413, 429). A route whose
        key travels in the body (`Auth.PARAM`) is counted as a request here too: only now is its
        client known; the others were counted before their body was read (`ClientRate`)."""
        limits = self.state.limits
        if self.route.auth is Auth.PARAM:
            limits.request(self.scope)
        limits.texts(self.scope, texts)

    def version(self) -> int:
        """The path's `{version}`: digits, or 422; a number no model has is the caller's 404."""
        raw = self.params["version"]
        try:
            if not raw.isdigit():
                raise ValueError(raw)
            return int(raw)
        except ValueError:
            raise InvalidInput("version must be a whole number") from None

    def parse(self, model: type[M], rules: Mapping[str, str]) -> M:
        """The JSON body as `model`: InvalidJson or UnreadableBody (400), InvalidInput (422)."""
        if not self.body:
            raise InvalidInput(describe_validation([MISSING], rules))
        try:
            data = load_json(self.body)
        except json.JSONDecodeError as exc:
            raise InvalidJson(f"invalid JSON at position {exc.pos}: {exc.msg}") from None
        except ValueError:
            raise UnreadableBody(UNREADABLE) from None
        try:
            return model.model_validate(data)
        except ValidationError as exc:
            raise InvalidInput(describe_validation(exc.errors(), rules)) from None


def json_answer(answer: BaseModel | Any) -> ASGIApp:
    """A JSON answer (a model's None fields left out), sent without a Response object."""
    if isinstance(answer, BaseModel):
        content = answer.model_dump_json(exclude_none=True).encode()
    else:
        content = json.dumps(answer, ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode()
    headers = [(b"content-length", str(len(content)).encode()), *JSON_HEADERS]

    async def send_answer(scope: Scope, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": content})

    return send_answer


async def read_body(receive: Receive) -> bytes:
    chunks = []
    while True:
        message = await receive()
        chunks.append(message.get("body", b""))
        if message["type"] != "http.request" or not message.get("more_body", False):
            return b"".join(chunks)


class Router:
    """Outermost: matches the request once; everything after it reads the match from the scope."""

    def __init__(self, app: ASGIApp, table: RouteTable) -> None:
        self.app, self.table = app, table

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            scope[MATCH_KEY] = self.table.match(scope["method"], scope["path"])
        await self.app(scope, receive, send)


class Endpoint:
    """Innermost: the matched route's handler. `lifespan` takes what is not HTTP (start-up and
    shutdown)."""

    def __init__(self, lifespan: ASGIApp) -> None:
        self.lifespan = lifespan

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.lifespan(scope, receive, send)
            return
        found = matched(scope)
        answer: ASGIApp
        if found is None:
            answer = error_response(Protocol.REST, "Not Found", "not_found")
        elif found.route is None:
            refused = error_response(found.protocol, "Method Not Allowed", "method_not_allowed")
            refused.headers["Allow"] = ", ".join(found.allowed)
            answer = refused
        else:
            route = found.route
            body = await read_body(receive) if reads_body(scope["method"]) else b""
            try:
                answer = await route.handler(Call(scope, route, found.params, body))
            except ServiceError as exc:
                await hold(exc, scope_state(scope).settings.limit_hold_s)
                answer = answer_error(route.protocol, exc)
        await answer(scope, receive, send)
