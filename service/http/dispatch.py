"""The one request path: match the route table once, run the middleware, call the route's handler.

`Router` is the outermost ASGI layer: it matches the request against the table and leaves the
`Match` in the scope, where the middleware reads the route's declared rules (probe, key, body
types, metric label). `Endpoint` is the innermost: it calls the matched route's handler with a
`Call` (for a route that runs a model, the handler is its codec: `service.http.pipeline`) and
turns a domain error into the route's protocol's error answer; a path no route has is
a 404, a method the path does not take a 405. Why not FastAPI's routing: with one text per
request its per-request layers (matching every route, dependency solving, exit stacks,
re-validating the answer) cost the event loop more CPU than the request's own work (py-spy under
`wrk`); here a request costs one dict lookup or one regex, and a handler parses its body once.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel
from starlette.types import ASGIApp, Receive, Scope, Send

from service.errors import ServiceError
from service.http.errors import MethodNotAllowed, NotFound, answer_error
from service.http.limits import hold
from service.http.scope import Call
from service.http.state import scope_state
from service.http.table import MATCH_KEY, Protocol, RouteTable, matched, reads_body

JSON_HEADERS = [(b"content-type", b"application/json")]


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
            answer = answer_error(Protocol.REST, NotFound("Not Found"))
        elif found.route is None:
            refused = answer_error(found.protocol, MethodNotAllowed("Method Not Allowed"))
            refused.headers["Allow"] = ", ".join(found.allowed)
            answer = refused
        else:
            route = found.route
            body = await read_body(receive) if reads_body(scope["method"]) else b""
            try:
                answer = await route.handler(Call(scope, found.params, body))
            except ServiceError as exc:
                await hold(exc, scope_state(scope).settings.limit_hold_s)
                answer = answer_error(route.protocol, exc)
        await answer(scope, receive, send)
