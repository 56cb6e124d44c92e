"""The route table: every HTTP route of the service declared once, as data.

A declaration (`Route`) holds what the rest of the HTTP layer needs to know of a route: its path
and methods, its handler, the protocol whose error shape and statuses it speaks, the request and
response bodies, whether it needs a key, what body types it takes, whether it is a probe, and its
metric label. The dispatcher (`service.http.dispatch`), the middleware (`service.http.middleware`,
`service.http.auth`) and the API document (`service.http.openapi`) read these fields and nothing
else: no module matches paths of its own.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel

from service.http.scope import MATCH_KEY, Handler
from service.settings import Settings

# What the API document knows of the models being served, per model: its name, task, integer
# limits (`max_new_tokens`) and the values a request field may take (`source_languages`).
ServedModel = tuple[str, str, tuple[tuple[str, int], ...], tuple[tuple[str, tuple[str, ...]], ...]]
Served = tuple[ServedModel, ...]
DocHook = Callable[[Settings, Served], Mapping[str, Any]]
# one served model's operation: what its own path takes, given the document's component schemas
ModelDocHook = Callable[[Mapping[str, Any], ServedModel], Mapping[str, Any]]


class Protocol(enum.Enum):
    """Whose conventions an answer follows: its error body and how error kinds map to statuses."""

    REST = "rest"  # {"error": ..., "type": ...}
    OIP = "oip"  # {"error": ...}, as the Open Inference Protocol says
    LIBRETRANSLATE = "libretranslate"  # {"error": ...}, with LibreTranslate's codes (400 for bad input)
    OPENAI = "openai"  # {"error": {"message", "type", "param", "code"}}, as OpenAI's API answers

    def status(self, status: int) -> int:
        """The status this protocol answers for `status`: LibreTranslate folds every bad request
        into a 400 and every key problem into a 403; the others answer it as it is."""
        return _LT_FOLDED.get(status, status) if self is Protocol.LIBRETRANSLATE else status


_LT_FOLDED = {401: 403, 404: 400, 413: 400, 415: 400, 422: 400}


class Auth(enum.Enum):
    """What a route needs (`service.http.auth` decides, from the keys the settings hold)."""

    OPEN = "open"  # nothing: health, readiness, metadata, the page
    BEARER = "bearer"  # inference: `Authorization: Bearer <key>`, checked before the body is read
    PARAM = "param"  # inference on LibreTranslate's API: its `api_key` parameter or the header (403)
    ADMIN = "admin"  # model control: closed unless turned on; then an admin key when there are any
    METRICS = "metrics"  # /metrics: a metrics or admin key when metrics keys are set


@dataclass(frozen=True)
class Access:
    """Which keys the server has and whether model control is on: what a route may answer depends on it."""

    inference: bool = False
    admin: bool = False
    metrics: bool = False
    model_control: bool = False

    def statuses(self, auth: Auth) -> set[int]:
        """The statuses a route's key check can answer."""
        if auth is Auth.ADMIN:  # closed, or a key of another role: 403; no key: 401
            return {403} | ({401} if self.model_control and self.admin else set())
        keyed = {Auth.BEARER: self.inference, Auth.PARAM: self.inference, Auth.METRICS: self.metrics}
        if not keyed.get(auth, False):
            return set()
        return {400, 403} if auth is Auth.PARAM else {401, 403}  # LibreTranslate: 400 for a missing key


BODY_ERRORS = (400, 408, 413, 415, 422)
"""What a request with a body can answer before its handler runs (`BodyLimit`)."""


def reads_body(method: str) -> bool:
    """A POST carries a body, checked and read before the handler runs; other methods' are not."""
    return method == "POST"


@dataclass(frozen=True)
class Route:
    path: str  # a template: "/v2/models/{name}/versions/{version}/infer"
    methods: tuple[str, ...]
    handler: Handler
    name: str  # unique; the API document's operation id
    protocol: Protocol = Protocol.REST
    summary: str = ""
    description: str = ""
    body: type[BaseModel] | None = None  # the JSON body, parsed by the handler and documented
    response: type[BaseModel] | None = None  # the 200 body (JSON)
    media_type: str = "application/json"  # of the 200 answer
    media_types: tuple[str, ...] = ()  # the 200 answer's other media types (a file route's formats)
    events: str = ""  # its stream option answers text/event-stream (`http.events`): what the events are
    auth: Auth = Auth.OPEN
    errors: tuple[int, ...] = ()  # statuses the handler itself can answer, beyond the rules below
    metric: str | None = None  # label of the request metrics; None: not counted
    probe: bool = False  # answered whatever the load, never refused as busy
    forms: bool = False  # also takes form-encoded bodies (LibreTranslate's clients send them)
    binary: bool = False  # also takes the OIP binary tensor extension's octet-stream bodies
    upload: bool = False  # takes multipart/form-data file uploads, up to `max_file_bytes`, instead of JSON
    names_served_model: bool = False  # its `{name}` is a model being served (the document lists them)
    documented: bool = True
    doc_extra: Mapping[str, Any] = field(default_factory=dict)  # merged into the document's operation
    # merged after doc_extra, rebuilt with the document: what depends on the settings and the
    # served models (a hand-written body's limits and language codes)
    doc_served: DocHook | None = None
    # set: the document lists the route once per served model, `{name}` filled in, merged with
    # this (what that model takes: an OIP model's own output names); no model served: the template
    doc_model: ModelDocHook | None = None

    @property
    def inference(self) -> bool:
        """Runs a model on a client's texts (counted in the request metrics, behind a key when the
        server has keys): what per-client limits apply to (`service.http.limits`)."""
        return self.metric is not None and self.auth is not Auth.OPEN

    def statuses(self, method: str, access: Access) -> tuple[int, ...]:
        """Every error status the route can answer for `method`, with the rules that add them: the
        in-flight limit (not for probes), per-client limits (inference), the body checks (a POST),
        the key check, the handler's own."""
        out = set(self.errors)
        if not self.probe:
            out.add(503)
        if self.inference:
            out.update((413, 429))
        if reads_body(method):
            out.update(BODY_ERRORS)
        out.update(access.statuses(self.auth))
        return tuple(sorted({self.protocol.status(s) for s in out}))


@dataclass(frozen=True, slots=True)
class Match:
    """What the path names: the route for the request's method (None: 405, see `allowed`), and the
    path's parameters."""

    route: Route | None
    params: dict[str, str]
    allowed: tuple[str, ...]
    protocol: Protocol  # the route's; for a 405, that of the path's first route


_PARAM = re.compile(r"{([a-z_]+)}")


def path_params(template: str) -> list[str]:
    """The parameters of a path template, in order: "/v2/models/{name}/infer" -> ["name"]."""
    return _PARAM.findall(template)


def _compile(template: str) -> re.Pattern[str]:
    parts, last = [], 0
    for m in _PARAM.finditer(template):
        parts += [re.escape(template[last : m.start()]), f"(?P<{m[1]}>[^/]+)"]
        last = m.end()
    parts.append(re.escape(template[last:]))
    return re.compile("".join(parts))


class RouteTable:
    """Matches a request to its declaration: fixed paths by lookup, templates by one regex each."""

    def __init__(self, routes: Iterable[Route]) -> None:
        self.routes = tuple(routes)
        by_path: dict[str, list[Route]] = {}
        for r in self.routes:
            by_path.setdefault(r.path, []).append(r)
        names = [r.name for r in self.routes]
        if len(set(names)) != len(names):
            raise ValueError(f"route names must be unique: {sorted(names)}")
        for path, rs in by_path.items():
            methods = [m for r in rs for m in r.methods]
            if len(set(methods)) != len(methods):
                raise ValueError(f"{path} declares a method twice")
        # fixed paths: every method's Match made once (a request costs two dict lookups)
        self._fixed = {p: _matches(rs, {}) for p, rs in by_path.items() if "{" not in p}
        self._templates = [(_compile(p), _matches(rs, {})) for p, rs in by_path.items() if "{" in p]

    def match(self, method: str, path: str) -> Match | None:
        """None: no route has this path (404)."""
        want = "GET" if method == "HEAD" else method
        fixed = self._fixed.get(path)
        if fixed is not None:
            return fixed.get(want) or fixed[""]
        for pattern, by_method in self._templates:
            m = pattern.fullmatch(path)
            if m is not None:
                found = by_method.get(want) or by_method[""]
                return Match(found.route, m.groupdict(), found.allowed, found.protocol)
        return None


def _matches(routes: tuple[Route, ...] | list[Route], params: dict[str, str]) -> dict[str, Match]:
    """A path's Match for each method its routes take, and under "" the Match of any other (405)."""
    allowed = tuple(m for r in routes for m in r.methods)
    out = {m: Match(r, params, allowed, r.protocol) for r in routes for m in r.methods}
    out[""] = Match(None, params, allowed, routes[0].protocol)
    return out


def matched(scope: Mapping[str, Any]) -> Match | None:
    found = scope.get(MATCH_KEY)
    return found if isinstance(found, Match) else None


def route_of(scope: Mapping[str, Any]) -> Route | None:
    """The route that answers this request; None for a 404 or a 405."""
    found = matched(scope)
    return found.route if found is not None else None


def protocol_of(scope: Mapping[str, Any]) -> Protocol:
    """The protocol an answer to this request speaks; REST for a path no route has."""
    found = matched(scope)
    return found.protocol if found is not None else Protocol.REST
