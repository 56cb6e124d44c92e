"""API keys: `SERVE_API_KEYS` set means every inference and repository endpoint wants
`Authorization: Bearer <key>` (401 otherwise); health, readiness, metrics and metadata stay open.
Keys are compared in constant time and never logged. The LibreTranslate API checks its own
`api_key` parameter (403, as its clients expect), see `service.http.libretranslate`.
"""

from __future__ import annotations

import hmac
import re
from collections.abc import Sequence

from starlette.types import ASGIApp, Receive, Scope, Send

from service.http.errors import error_response

# Inference and repository routes; the REST task routes are added by the app (one per task).
PROTECTED = re.compile(r"^/v2/models/[^/]+(/versions/[^/]+)?/infer$|^/v2/repository(/|$)")


def key_allowed(given: str, keys: Sequence[str]) -> bool:
    """Constant time in the key's content: every key is compared, whatever matched."""
    found = False
    for key in keys:
        found |= hmac.compare_digest(given.encode("utf-8", "replace"), key.encode("utf-8"))
    return found and bool(given)


class ApiKeys:
    """ASGI middleware: 401 with the one error format for a protected path without a valid key."""

    def __init__(self, app: ASGIApp, keys: Sequence[str], task_paths: frozenset[str]) -> None:
        self.app, self.keys, self.task_paths = app, tuple(keys), task_paths

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "")
        if scope["type"] != "http" or not self.keys or not (path in self.task_paths or PROTECTED.match(path)):
            await self.app(scope, receive, send)
            return
        given = ""
        for name, value in scope.get("headers", ()):
            if name == b"authorization":
                text = value.decode("latin-1")
                if text[:7].lower() == "bearer ":
                    given = text[7:].strip()
        if not key_allowed(given, self.keys):
            message = "a valid API key is required: Authorization: Bearer <key>"
            response = error_response(path, message, "unauthorized")
            response.headers["WWW-Authenticate"] = 'Bearer realm="transformer-serve"'
            await response(scope, receive, send)
            return
        await self.app(scope, receive, send)
