"""The bottom of the HTTP layer: what one request's ASGI scope holds and how to read it.

The request's id and arrival time (`RequestInfo`), its headers and query string, the keys under
which the router, the key check and the server leave what they found, and `Call`: a request as a
route's handler gets it. Everything else in `service/http/` imports this module; it imports
nothing of the service but its domain errors, so the layers above it cannot form a cycle here.
"""

from __future__ import annotations

import itertools
import secrets
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs

from starlette.types import ASGIApp, Scope

from service.errors import InvalidInput

SCOPE_KEY = "serve.request"
"""Where the outermost middleware leaves the request's `RequestInfo`."""
DISCONNECTED = "serve.disconnected"
"""Set in the scope when the client left before its answer."""
LINK_KEY = "serve.link"
"""A `RequestLink`, from a server that offers one (`service.http.middleware`)."""
KEY_ID = "serve.key_id"
"""Where the key check leaves a request's valid key's id (absent: no key, or none needed): the
audit lines and the per-client limits read it."""
MATCH_KEY = "serve.match"
"""Where the router leaves a request's `Match` (absent: no route has the path)."""


@dataclass
class RequestInfo:
    request_id: str
    start: float  # time.monotonic() when the request arrived: every deadline counts from here
    model: str = ""  # set once the model is resolved
    trace_id: str = ""  # 32 hex digits, when the request is traced: the latency histogram's exemplar


_ID_PREFIX, _ID_COUNTER = secrets.token_hex(8), itertools.count()


def new_request_id() -> str:
    """32 hex digits: a random per-process prefix and a counter (unique like uuid4, without a
    getrandom call per request)."""
    return f"{_ID_PREFIX}{next(_ID_COUNTER):016x}"


def request_info(scope: Scope) -> RequestInfo:
    info = scope.get(SCOPE_KEY)
    return info if isinstance(info, RequestInfo) else RequestInfo(new_request_id(), time.monotonic())


def client_address(scope: Scope) -> str | None:
    """The connection's peer, `host:port`, as the access and audit lines name it."""
    client = scope.get("client")
    return f"{client[0]}:{client[1]}" if client else None


def header(scope: Scope, name: bytes) -> str | None:
    for k, v in scope.get("headers", ()):
        if k == name:
            return str(v.decode("latin-1"))
    return None


@dataclass(slots=True)
class Call:
    """One request as a handler sees it: its scope, the path's parameters, the body as received."""

    scope: Scope
    params: Mapping[str, str]
    body: bytes

    @property
    def info(self) -> RequestInfo:
        return request_info(self.scope)

    def header(self, name: bytes) -> str | None:
        return header(self.scope, name)

    def query(self) -> dict[str, Any]:
        """The query string; a repeated key is a list."""
        raw = self.scope.get("query_string", b"").decode("latin-1")
        return {k: v[0] if len(v) == 1 else v for k, v in parse_qs(raw).items()}

    def version(self) -> int:
        """The path's `{version}`: digits, or 422; a number no model has is the caller's 404."""
        raw = self.params["version"]
        if not raw.isdigit():
            raise InvalidInput("version must be a whole number")
        try:
            return int(raw)
        except ValueError:
            raise InvalidInput("version must be a whole number") from None


Handler = Callable[[Call], Awaitable[ASGIApp]]
"""A route's handler: the request in, the answer (an ASGI app) out; a domain error raised is
answered in the route's protocol by the dispatcher."""
