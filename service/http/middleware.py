"""ASGI middleware: request id, access log and request metrics; body size and content type.

Pure ASGI (no BaseHTTPMiddleware): the route runs in the same task, and the body is checked on
the raw stream, so a lying or missing Content-Length cannot get more than the limit through.

A server that knows its connections (`service.server`'s protocol) puts a `RequestLink` in each
request's scope: then a body that arrived with its headers is read without a timer, and a client
that leaves is reported by the server, where otherwise a task per request watches `receive`
(with the timer, 0.88x the event loop's CPU per served `/predict`: `bench.ab_http`, 10 pairs).
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
import zlib
from collections.abc import Callable

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service.errors import BadRequest, PayloadTooLarge, ServiceError
from service.http.binary import HEADER_LENGTH, is_count
from service.http.errors import InternalError, Overloaded, RequestTimeout, UnsupportedMediaType, answer_error
from service.http.limits import ClientLimits, hold
from service.http.scope import (
    DISCONNECTED,
    LINK_KEY,
    SCOPE_KEY,
    RequestInfo,
    client_address,
    header,
    new_request_id,
)
from service.http.table import Auth, protocol_of, reads_body, route_of
from service.logs import ACCESS
from service.metrics import Metrics

log = logging.getLogger(__name__)

CLIENT_CLOSED = 499  # status logged for such a request (nginx's convention)
REQUEST_ID_HEADER = b"x-request-id"
_VALID_ID = re.compile(r"^[A-Za-z0-9._:/+=-]{1,128}$")
_OCTETS = "application/octet-stream"
_FORM = "application/x-www-form-urlencoded"
_MULTIPART = "multipart/form-data"
_JSON_TYPE = re.compile(r"^application/([a-z0-9.+-]*\+)?json\s*(;.*)?$", re.IGNORECASE)


class RequestLink:
    """What the server tells the app about one request's connection: whether the whole body has
    arrived (`body_arrived`), and, through `on_lost`, that the client left before the answer
    completed (called at most once, on the event loop)."""

    __slots__ = ("body_arrived", "on_lost")

    def __init__(self, body_arrived: Callable[[], bool]) -> None:
        self.body_arrived = body_arrived
        self.on_lost: Callable[[], None] | None = None

    def lost(self) -> None:
        if self.on_lost is not None:
            self.on_lost()


class RequestContext:
    """Outermost after the router: request id (X-Request-ID honoured or generated, always echoed),
    access log, request metrics (routes declaring a `metric` label), and the one 500 answer for
    exceptions nothing else handled (logged).

    It also bounds the requests in flight: beyond `max_in_flight`, a request to a route that is no
    probe gets a 503 with Retry-After at once, before its body is read (the cheapest refusal
    there is, when even the queues' 429 would cost too much)."""

    def __init__(self, app: ASGIApp, metrics: Metrics, max_in_flight: int) -> None:
        self.app, self.metrics = app, metrics
        self.max_in_flight, self.in_flight = max_in_flight, 0
        self.arriving = 0  # of those in flight, the ones still waiting for their body

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        given = header(scope, REQUEST_ID_HEADER)
        info = RequestInfo(given if given and _VALID_ID.match(given) else new_request_id(), time.monotonic())
        scope[SCOPE_KEY] = info
        status = 0

        async def send_with_id(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                message["headers"] = [*message.get("headers", []), (REQUEST_ID_HEADER, info.request_id.encode())]
            await send(message)

        # A request whose body is still on its way takes no place among those in flight until it
        # has come, and is checked then: clients that send headers and stall (BodyLimit's 408
        # ends them) never keep everyone else out.
        link = scope.get(LINK_KEY)
        arriving = isinstance(link, RequestLink) and not link.body_arrived() and reads_body(scope["method"])
        if arriving:
            self.arriving += 1
            outer = receive

            async def receive() -> Message:
                nonlocal arriving
                message = await outer()
                if arriving and not message.get("more_body", False):
                    arriving = False
                    self.arriving -= 1
                    if self._busy():
                        raise _Busy
                return message

        self.in_flight += 1
        try:
            route = route_of(scope)
            if not arriving and self._busy() and not (route is not None and route.probe):
                raise _Busy
            await self.app(scope, receive, send_with_id)
            if scope.get(DISCONNECTED) and status == 0:
                status = CLIENT_CLOSED
        except _Busy:
            if status == 0:
                busy = f"server busy: {self.in_flight - 1} requests in flight; retry later"
                refuse = answer_error(protocol_of(scope), Overloaded(busy))
                await refuse(scope, receive, closing_if_unread(scope, send_with_id))
        except Exception:
            log.exception(
                "unhandled error in %s %s",
                scope.get("method"),
                scope.get("path"),
                extra={"fields": {"request_id": info.request_id}},
            )
            if status == 0:
                response = answer_error(protocol_of(scope), InternalError("internal server error"))
                await response(scope, receive, send_with_id)
            status = status or 500
        finally:
            self.in_flight -= 1
            if arriving:
                self.arriving -= 1
            self._record(scope, info, status)

    def _busy(self) -> bool:
        return self.in_flight - self.arriving > self.max_in_flight

    def _record(self, scope: Scope, info: RequestInfo, status: int) -> None:
        duration = time.monotonic() - info.start
        route = route_of(scope)
        if route is not None and route.metric is not None:
            self.metrics.answered(route.metric, info.model, status, duration, info.trace_id)
        if ACCESS.isEnabledFor(logging.INFO):
            ACCESS.info(
                "%s %s %d",
                scope.get("method"),
                scope.get("path"),
                status,
                extra={
                    "fields": {
                        "request_id": info.request_id,
                        "method": scope.get("method"),
                        "path": scope.get("path"),
                        "status": status,
                        "duration_ms": round(duration * 1000, 3),
                        "model": info.model or None,
                        "client": client_address(scope),
                    }
                },
            )


class ClientRate:
    """Requests per minute per client (`service.http.limits`) on the inference routes, before the
    body is read: the key, if any, was checked by now (`Auth.BEARER`). LibreTranslate's key may
    travel in the body: the pipeline counts the request once the key is known (`service.http.pipeline`).
    A refusal is held before it is sent (`limits.hold`)."""

    def __init__(self, app: ASGIApp, limits: ClientLimits, hold_s: float = 0.0) -> None:
        self.app, self.limits, self.hold_s = app, limits, hold_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        route = route_of(scope) if scope["type"] == "http" else None
        if route is not None and route.inference and route.auth is Auth.BEARER:
            try:
                self.limits.request(scope)
            except ServiceError as exc:
                await hold(exc, self.hold_s)
                await answer_error(route.protocol, exc)(scope, receive, send)
                return
        await self.app(scope, receive, send)


class BodyLimit:
    """POST bodies: JSON (a missing Content-Type is read as JSON, a wrong
    one is a 415; form-encoded or binary tensors where the route declares them), at most
    `max_bytes` (counted on the stream, and again once a gzip or deflate Content-Encoding is
    undone), read here and replayed to the route. While the route
    works, the connection is watched: a client that disconnects before its answer has started
    cancels the route (its sentences leave the running batch); the request is logged with status
    499. Requests to no route, or with a method their path does not take, go on (404/405).
    """

    def __init__(self, app: ASGIApp, max_bytes: int, body_timeout: float = 10.0, max_file_bytes: int = 0) -> None:
        self.app, self.max_bytes, self.body_timeout = app, max_bytes, body_timeout
        self.max_file_bytes = max_file_bytes or max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        route = route_of(scope) if scope["type"] == "http" else None
        if route is None or not reads_body(scope["method"]):
            await self.app(scope, receive, send)
            return
        protocol = route.protocol
        limit = self.max_file_bytes if route.upload else self.max_bytes
        too_large = f"the request body exceeds {limit} bytes"
        early = closing_if_unread(scope, send)  # for answers given before the body is read
        declared = header(scope, b"content-length")
        if declared is not None:
            if not is_count(declared):
                await answer_error(protocol, BadRequest("invalid Content-Length header"))(scope, receive, early)
                return
            if int(declared) > limit:
                await answer_error(protocol, PayloadTooLarge(too_large))(scope, receive, early)
                return
        content_type = (header(scope, b"content-type") or "").strip()
        kind = content_type.split(";")[0].strip().lower()
        binary = route.binary and header(scope, HEADER_LENGTH) is not None
        form = route.forms and kind == _FORM
        if route.upload and kind != _MULTIPART:
            wrong_type = "Content-Type must be multipart/form-data"
            await answer_error(protocol, UnsupportedMediaType(wrong_type))(scope, receive, early)
            return
        if (
            content_type
            and not route.upload
            and not _JSON_TYPE.match(content_type)
            and not (binary and content_type == _OCTETS)
            and not form
        ):
            wrong_type = "Content-Type must be application/json"
            await answer_error(protocol, UnsupportedMediaType(wrong_type))(scope, receive, early)
            return
        encoding = (header(scope, b"content-encoding") or "identity").strip().lower()
        if encoding not in _WBITS:
            wrong_coding = "Content-Encoding must be gzip, deflate or identity"
            await answer_error(protocol, UnsupportedMediaType(wrong_coding))(scope, receive, early)
            return
        link = scope.get(LINK_KEY)
        try:
            if isinstance(link, RequestLink) and link.body_arrived():  # no timer: nothing to wait for
                chunks, size = await _read(receive, limit)
            else:
                async with asyncio.timeout(self.body_timeout):  # no task per request, unlike wait_for
                    chunks, size = await _read(receive, limit)
        except TimeoutError:
            late = f"the request body did not arrive within {self.body_timeout:g} s"
            await answer_error(protocol, RequestTimeout(late))(scope, receive, _closing(send))
            return
        except _ClientLeft:
            return
        if size > limit:
            await answer_error(protocol, PayloadTooLarge(too_large))(scope, receive, send)
            return
        body = b"".join(chunks)
        if _WBITS[encoding]:
            try:
                body = inflate(body, _WBITS[encoding], limit)
            except zlib.error:
                bad = f"the body is not {encoding} data"
                await answer_error(protocol, BadRequest(bad))(scope, receive, send)
                return
            except OverflowError:
                await answer_error(protocol, PayloadTooLarge(too_large))(scope, receive, send)
                return
        await _run_watched(self.app, scope, body, receive, send)


# Content-Encoding -> zlib's wbits (0: nothing to undo). HTTP's "deflate" is the zlib format;
# raw deflate, which some clients send under that name, is taken too.
_WBITS = {"identity": 0, "gzip": 31, "x-gzip": 31, "deflate": 15}


def inflate(data: bytes, wbits: int, limit: int) -> bytes:
    """A compressed body (tritonclient's request compression, a gzipped JSON) undone, at most
    `limit` bytes of it: OverflowError beyond, however small the compressed body (a bomb is cut
    at the limit, never expanded whole); zlib.error for data that is not of that format."""
    try:
        return _inflate(data, wbits, limit)
    except zlib.error:
        if wbits != 15:
            raise
        return _inflate(data, -15, limit)


def _inflate(data: bytes, wbits: int, limit: int) -> bytes:
    d = zlib.decompressobj(wbits)
    out = d.decompress(data, limit + 1)
    if len(out) > limit:
        raise OverflowError(limit)
    if not d.eof:
        raise zlib.error("incomplete data")
    return out


def closing_if_unread(scope: Scope, send: Send) -> Send:
    """`send`, closing the connection after its answer when the client waits for a 100 Continue
    before it sends its body: answered without it, the client never sends the body, and the
    connection's next request would be read as that body."""
    link = scope.get(LINK_KEY)
    expects = (header(scope, b"expect") or "").strip().lower() == "100-continue"
    return _closing(send) if expects and not (isinstance(link, RequestLink) and link.body_arrived()) else send


def _closing(send: Send) -> Send:
    async def closing(message: Message) -> None:
        if message["type"] == "http.response.start":
            message["headers"] = [*message.get("headers", []), (b"connection", b"close")]
        await send(message)

    return closing


class _Busy(Exception):
    """More requests in flight than `RequestContext` admits: answered 503 there."""


class _ClientLeft(Exception):
    pass


async def _read(receive: Receive, limit: int) -> tuple[list[bytes], int]:
    """The body's chunks and their size, up to the first chunk that passes `limit`."""
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise _ClientLeft
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            return chunks, size
        chunks.append(chunk)
        if not message.get("more_body", False):
            return chunks, size


class _Watched:
    """A route's view of its request: the body replayed, sends tracked, and `left()` when the
    client leaves: the route is cancelled if its answer has not started."""

    __slots__ = ("scope", "body", "route", "started", "finishing", "gone", "_left", "_send")

    def __init__(self, scope: Scope, body: bytes, route: asyncio.Task[object], send: Send) -> None:
        self.scope, self.route, self._send = scope, route, send
        self.body: bytes | None = body  # None once replayed
        self.started = self.finishing = self.gone = False
        self._left: asyncio.Event | None = None  # made when a route waits past its body (rare)

    async def receive(self) -> Message:
        if self.body is not None:
            body, self.body = self.body, None
            return {"type": "http.request", "body": body, "more_body": False}
        if not self.gone:
            self._left = self._left or asyncio.Event()
            await self._left.wait()
        return {"type": "http.disconnect"}

    async def send(self, message: Message) -> None:
        self.started = self.started or message["type"] == "http.response.start"
        await self._send(message)

    def left(self) -> None:
        self.gone = True
        if self._left is not None:
            self._left.set()
        if not self.started and not self.finishing:
            self.scope[DISCONNECTED] = True
            self.route.cancel()


async def _watch(receive: Receive, watched: _Watched) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass
    watched.left()


async def _run_watched(app: ASGIApp, scope: Scope, body: bytes, receive: Receive, send: Send) -> None:
    """Runs the route with the body replayed; cancels it if the client disconnects first."""
    route = asyncio.current_task()  # the route runs in this task (one task less per request)
    assert route is not None
    watched = _Watched(scope, body, route, send)
    link = scope.get(LINK_KEY)
    watcher = None
    if isinstance(link, RequestLink):
        link.on_lost = watched.left
    else:  # a server that reports nothing: watch its receive
        watcher = asyncio.ensure_future(_watch(receive, watched))
    try:
        await app(scope, watched.receive, watched.send)
    except asyncio.CancelledError:
        if not scope.get(DISCONNECTED):
            raise  # the server is cancelling us, not the client
        route.uncancel()
    else:
        if scope.get(DISCONNECTED):  # the route finished despite our cancel: take it back (no later await sees it)
            route.uncancel()
    finally:
        watched.finishing = True
        if watcher is not None:
            watcher.cancel()
        elif isinstance(link, RequestLink):
            link.on_lost = None
