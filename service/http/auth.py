"""Who may call what: inference keys, admin keys and metrics keys, and model control.

A route declares what it needs (`service.http.table.Auth`); `KeyRing.check` decides, from the
settings' keys, for the key a request gave. Inference routes want an inference or admin key when
inference keys are set (`SERVE_API_KEYS`); `/metrics` a metrics or admin key when metrics keys
are set. Model control (the repository's load and unload) is closed unless the operator turns it
on (`SERVE_MODEL_CONTROL=explicit`, the default once admin keys are set), and then wants an admin
key: an inference key never opens it, and with inference keys but no admin keys it stays closed.

No key or an unknown one is a 401, a valid key of another role a 403 (LibreTranslate's routes
answer as LibreTranslate: 400 for none, 403 for a wrong one; `libretranslate.check_key`).
Keys are compared in constant time and never logged: a key is named by its id (`name:key` in the
settings names it; else `key-` and 8 hex digits of its sha256). Every refusal and every
model-control action is logged once on the audit logger with the request id, key id and client
address, and refusals are counted by reason.
"""

from __future__ import annotations

import enum
import hashlib
import hmac
import logging
import re
from dataclasses import dataclass

from starlette.types import ASGIApp, Receive, Scope, Send

from service.errors import ServiceError
from service.http.errors import Forbidden, Unauthorized, answer_error
from service.http.scope import KEY_ID, client_address, header, request_info
from service.http.table import Access, Auth, route_of
from service.metrics import Metrics
from service.settings import Settings

AUDIT = logging.getLogger("service.audit")

_NAMED = re.compile(r"^([A-Za-z0-9_.-]{1,64}):(.+)$")


class Role(enum.Enum):
    INFERENCE = "inference"
    ADMIN = "admin"
    METRICS = "metrics"


@dataclass(frozen=True)
class Key:
    id: str
    secret: bytes
    role: Role


def key_id(secret: str) -> str:
    """A name for a key that says nothing about it: logs, metrics and limit files use it."""
    return "key-" + hashlib.sha256(secret.encode("utf-8", "replace")).hexdigest()[:8]


def parse_keys(value: str, role: Role) -> list[Key]:
    """`name:key` or a bare key, comma-separated."""
    out = []
    for entry in (e.strip() for e in value.split(",")):
        if not entry:
            continue
        named = _NAMED.match(entry)
        name, secret = (named[1], named[2]) if named else (key_id(entry), entry)
        out.append(Key(name, secret.encode("utf-8"), role))
    return out


def bearer(authorization: str | None) -> str:
    """The key of an `Authorization: Bearer <key>` header; "" for none."""
    if authorization and authorization[:7].lower() == "bearer ":
        return authorization[7:].strip()
    return ""


@dataclass(frozen=True)
class Verdict:
    """A refusal: the error (no valid key: 401, a key that may not: 403), the message, the metric's reason."""

    error: type[ServiceError]
    message: str
    reason: str

    @property
    def kind(self) -> str:
        return self.error.kind


@dataclass(frozen=True)
class KeyRing:
    keys: tuple[Key, ...]
    model_control: bool

    @classmethod
    def of(cls, settings: Settings) -> KeyRing:
        keys = [
            *parse_keys(_secret(settings.api_keys), Role.INFERENCE),
            *parse_keys(_secret(settings.admin_keys), Role.ADMIN),
            *parse_keys(_secret(settings.metrics_keys), Role.METRICS),
        ]
        control = settings.model_control or ("explicit" if settings.admin_keys else "none")
        return cls(tuple(keys), control == "explicit")

    def has(self, role: Role) -> bool:
        return any(k.role is role for k in self.keys)

    @property
    def access(self) -> Access:
        return Access(
            inference=self.has(Role.INFERENCE),
            admin=self.has(Role.ADMIN),
            metrics=self.has(Role.METRICS),
            model_control=self.model_control,
        )

    def find(self, given: str) -> Key | None:
        """The key `given` is, comparing against every key whatever matched (constant time in
        the keys' content)."""
        raw, found = given.encode("utf-8", "replace"), None
        for key in self.keys:
            if hmac.compare_digest(raw, key.secret) and given:
                found = key
        return found

    def check(self, auth: Auth, given: str) -> tuple[Key | None, Verdict | None]:
        """The key (None: none given or none needed) and the refusal (None: allowed)."""
        if auth is Auth.OPEN:
            return None, None
        if auth is Auth.ADMIN:
            if not self.model_control:
                why = "model control is off: the operator turns it on with SERVE_MODEL_CONTROL=explicit"
                return None, Verdict(Forbidden, why, "model_control_off")
            if not self.has(Role.ADMIN):
                if self.has(Role.INFERENCE):  # an inference key never opens model control
                    why = "model control needs an admin key, and the server has none (SERVE_ADMIN_KEYS)"
                    return None, Verdict(Forbidden, why, "no_admin_keys")
                return None, None
            wanted = {Role.ADMIN}
        elif auth is Auth.METRICS:
            if not self.has(Role.METRICS):
                return None, None
            wanted = {Role.METRICS, Role.ADMIN}
        else:  # BEARER, PARAM: inference
            if not self.has(Role.INFERENCE):
                return None, None
            wanted = {Role.INFERENCE, Role.ADMIN}
        key = self.find(given)
        if key is None:
            reason = "invalid_key" if given else "missing_key"
            return None, Verdict(Unauthorized, "a valid API key is required: Authorization: Bearer <key>", reason)
        if key.role not in wanted:
            needed = " or ".join(sorted(r.value for r in wanted))
            return key, Verdict(Forbidden, f"this key's role ({key.role.value}) may not do this: {needed}", "role")
        return key, None


def _secret(value: object) -> str:
    get = getattr(value, "get_secret_value", None)
    return str(get()) if get is not None else ""


def audit(scope: Scope, message: str, level: int = logging.INFO, **fields: object) -> None:
    """One audit line: what happened, with the request id, the key id (never the key) and the client."""
    base = {"request_id": request_info(scope).request_id, "key_id": scope.get(KEY_ID)}
    AUDIT.log(level, message, extra={"fields": base | {"client": client_address(scope)} | fields})


def refused(scope: Scope, metrics: Metrics, verdict: Verdict, key: Key | None) -> None:
    metrics.auth_refusals.labels(reason=verdict.reason).inc()
    route = route_of(scope)
    name = route.name if route else None
    if key is not None:
        scope[KEY_ID] = key.id
    audit(scope, f"refused: {verdict.reason}", logging.WARNING, route=name, reason=verdict.reason)


class ApiKeys:
    """ASGI middleware: a route's key check before its body is read, in the route's error shape.
    LibreTranslate's routes (`Auth.PARAM`) take the key from the body too: their handlers check it."""

    def __init__(self, app: ASGIApp, ring: KeyRing, metrics: Metrics) -> None:
        self.app, self.ring, self.metrics = app, ring, metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        route = route_of(scope) if scope["type"] == "http" else None
        if route is None or route.auth in (Auth.OPEN, Auth.PARAM):
            await self.app(scope, receive, send)
            return
        key, verdict = self.ring.check(route.auth, bearer(header(scope, b"authorization")))
        if verdict is not None:
            refused(scope, self.metrics, verdict, key)
            response = answer_error(route.protocol, verdict.error(verdict.message))
            if verdict.error is Unauthorized:
                response.headers["WWW-Authenticate"] = 'Bearer realm="transformer-serve"'
            await response(scope, receive, send)
            return
        if key is not None:
            scope[KEY_ID] = key.id
        await self.app(scope, receive, send)
