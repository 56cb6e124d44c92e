"""API keys: with `SERVE_API_KEYS` set, a route declared `Auth.BEARER` wants
`Authorization: Bearer <key>` (401 otherwise), checked here before its body is read; routes
declared `Auth.PARAM` (the LibreTranslate API) check their own `api_key` parameter with
`key_allowed` (403, as its clients expect). Keys are compared in constant time and never logged.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Sequence

from starlette.types import ASGIApp, Receive, Scope, Send

from service.http.errors import error_response
from service.http.table import Auth, route_of

KEY_ID = "serve.key_id"
"""Where a request with a valid key finds the key's id in the ASGI scope (per-client limits read it)."""


def key_id(key: str) -> str:
    """A key's name in logs, limits and files: its hash's first 8 hex digits, never the key."""
    return "key-" + hashlib.sha256(key.encode("utf-8")).hexdigest()[:8]


def key_allowed(given: str, keys: Sequence[str]) -> bool:
    """Constant time in the key's content: every key is compared, whatever matched."""
    found = False
    for key in keys:
        found |= hmac.compare_digest(given.encode("utf-8", "replace"), key.encode("utf-8"))
    return found and bool(given)


def bearer(authorization: str | None) -> str:
    """The key of an `Authorization: Bearer <key>` header; "" for none."""
    if authorization and authorization[:7].lower() == "bearer ":
        return authorization[7:].strip()
    return ""


class ApiKeys:
    """ASGI middleware: 401 in the route's error shape for a `Auth.BEARER` route without a valid key."""

    def __init__(self, app: ASGIApp, keys: Sequence[str]) -> None:
        self.app, self.keys = app, tuple(keys)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        route = route_of(scope) if self.keys and scope["type"] == "http" else None
        if route is None or route.auth is not Auth.BEARER:
            await self.app(scope, receive, send)
            return
        given = ""
        for name, value in scope.get("headers", ()):
            if name == b"authorization":
                given = bearer(value.decode("latin-1"))
        if not key_allowed(given, self.keys):
            message = "a valid API key is required: Authorization: Bearer <key>"
            response = error_response(route.protocol, message, "unauthorized")
            response.headers["WWW-Authenticate"] = 'Bearer realm="transformer-serve"'
            await response(scope, receive, send)
            return
        scope[KEY_ID] = key_id(given)
        await self.app(scope, receive, send)
