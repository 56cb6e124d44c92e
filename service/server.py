"""Running the app under uvicorn, with a graceful SIGTERM.

SIGTERM, the Kubernetes way: /readyz answers 503 at once, while requests that still arrive are
served as usual for SERVE_DRAIN_GRACE_S (time for load balancers to stop routing here); then the
listener closes, idle connections are closed, and admitted work finishes within
SERVE_DRAIN_TIMEOUT_S (uvicorn's graceful shutdown, then the lifespan's: batchers closed); the
process exits 0. A second SIGTERM or a SIGINT takes uvicorn's usual path.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
import sys
from pathlib import Path
from types import FrameType
from typing import Any

import uvicorn
from fastapi import FastAPI
from uvicorn.protocols.http.h11_impl import H11Protocol

from service import logs
from service.app import create_app
from service.errors import BadRequest
from service.http.errors import HeadersTooLarge
from service.http.middleware import LINK_KEY, RequestLink
from service.http.state import AppState
from service.settings import Settings, unknown_variables

log = logging.getLogger(__name__)


class HeaderDeadline:
    """A deadline and a size limit for a request's headers, mixed into uvicorn's HTTP protocols.

    uvicorn times out idle keep-alive connections, but only after a first response, and any byte
    restarts that timer: a client that connects and stays silent, or sends its headers a byte at
    a time (slowloris), would hold its connection forever. Here a connection must complete each
    request's headers within `header_timeout` seconds of connecting or of its previous response;
    otherwise it is closed. Headers above `max_header_bytes` get a 431 and the connection is
    closed (httptools sets no limit of its own). (A slow body is the app's business: `BodyLimit`
    answers 408.)
    """

    header_timeout = 10.0
    max_header_bytes = 16384
    _header_timer: asyncio.TimerHandle | None = None
    _header_bytes = 0  # of the request whose headers are arriving
    _awaiting_headers = True
    # provided by the protocol class this is mixed into
    loop: asyncio.AbstractEventLoop
    transport: asyncio.Transport
    cycle: Any
    flow: Any

    def connection_made(self, transport: asyncio.Transport) -> None:
        super().connection_made(transport)  # type: ignore[misc]
        self._arm()

    def data_received(self, data: bytes) -> None:
        cycle = self.cycle
        # the rest of a body the app answered early (413, 408) is the parser's to skip, not headers
        if self._awaiting_headers and not (cycle is not None and cycle.more_body):
            end = data.find(b"\r\n\r\n")
            seen = self._header_bytes + (end if end >= 0 else len(data))
            if seen > self.max_header_bytes:
                self._refuse_headers()
                return
            self._header_bytes = 0 if end >= 0 else seen
        elif cycle is not None and not cycle.more_body and not cycle.response_complete:
            # the next request, pipelined while this one is answered: read no further than one
            # header limit ahead (the rest waits in the socket; reading resumes after the answer,
            # where the limit applies to it), so headers that never end cannot fill the memory
            self._header_bytes += len(data)
            if self._header_bytes > self.max_header_bytes:
                self.flow.pause_reading()
        super().data_received(data)  # type: ignore[misc]
        if self.cycle is not None and not self.cycle.response_complete:
            self._disarm()  # the headers are in: the request is the app's now
            self._awaiting_headers = False

    def on_response_complete(self) -> None:
        super().on_response_complete()  # type: ignore[misc]
        self._awaiting_headers, self._header_bytes = True, 0
        self._arm()

    def send_400_response(self, msg: str) -> None:
        """uvicorn's answer to bytes its parser refuses, as JSON like every other error."""
        body = b'{"error":"invalid HTTP request","type":"%s"}' % BadRequest.kind.encode()
        head = b"HTTP/1.1 400 Bad Request\r\ncontent-type: application/json\r\nconnection: close\r\n"
        self.transport.write(head + b"content-length: %d\r\n\r\n" % len(body) + body)
        self.transport.close()

    def _refuse_headers(self) -> None:
        """431 and close, before the parser spends time on headers no request needs."""
        kind, status = HeadersTooLarge.kind.encode(), HeadersTooLarge.status
        body = b'{"error":"request headers above %d bytes","type":"%s"}' % (self.max_header_bytes, kind)
        head = b"HTTP/1.1 %d Request Header Fields Too Large\r\ncontent-type: application/json\r\n" % status
        self.transport.write(head + b"connection: close\r\ncontent-length: %d\r\n\r\n" % len(body) + body)
        self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)  # type: ignore[misc]

    def _arm(self) -> None:
        self._disarm()
        self._header_timer = self.loop.call_later(self.header_timeout, self._too_slow)

    def _disarm(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _too_slow(self) -> None:
        if not self.transport.is_closing() and (self.cycle is None or self.cycle.response_complete):
            self.transport.close()


class RequestLinks:
    """Mixed into uvicorn's HTTP protocols: each request's scope gets a `RequestLink`, through
    which the app learns that its body has arrived and that its client left (so it needs neither
    a body timer for a body that came with the headers nor a task per request watching `receive`)."""

    cycle: Any

    def data_received(self, data: bytes) -> None:
        super().data_received(data)  # type: ignore[misc]
        cycle = self.cycle
        if cycle is not None and LINK_KEY not in cycle.scope:  # before its task first runs
            cycle.scope[LINK_KEY] = RequestLink(lambda: not cycle.more_body)

    def connection_lost(self, exc: Exception | None) -> None:
        cycle = self.cycle
        super().connection_lost(exc)  # type: ignore[misc]
        if cycle is not None and cycle.disconnected:  # before its answer completed
            link = cycle.scope.get(LINK_KEY)
            if isinstance(link, RequestLink):
                link.lost()


def guarded_protocol(header_timeout: float, max_header_bytes: int = 16384) -> type:
    """uvicorn's fastest HTTP/1.1 protocol here (httptools, a C parser; else h11) with the
    header deadline and size limit, and request links."""
    try:
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

        base: type = HttpToolsProtocol
    except ImportError:  # httptools missing: the pure-Python parser
        base = H11Protocol
    limits = {"header_timeout": header_timeout, "max_header_bytes": max_header_bytes}
    return type(f"Guarded{base.__name__}", (HeaderDeadline, RequestLinks, base), limits)


class DrainingServer(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, state: AppState) -> None:
        super().__init__(config)
        self.state = state
        self._loop: asyncio.AbstractEventLoop | None = None
        self._drain: asyncio.Task[None] | None = None

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        self._loop = asyncio.get_running_loop()
        await super().startup(sockets)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if sig == signal.SIGTERM and not self.state.draining and self._loop is not None and not self.should_exit:
            self.state.draining = True  # not re-raised after shutdown: the exit code stays 0
            self._loop.call_soon_threadsafe(self._start_drain)
            return
        super().handle_exit(sig, frame)

    def _start_drain(self) -> None:
        self._drain = asyncio.create_task(self.drain(), name="drain")

    async def drain(self) -> None:
        s = self.state.settings
        log.info(
            "SIGTERM: not ready; serving %.1f s more, then closing the listener and draining for up to %.1f s",
            s.drain_grace_s,
            s.drain_timeout_s,
        )
        await asyncio.sleep(s.drain_grace_s)
        # At once, not at uvicorn's next tick (0.1 s): a connection a balancer opens meanwhile is
        # refused, which it retries elsewhere, where a 503 would have failed the request (measured,
        # bench/rolling.py). Idle keep-alive connections close; busy ones close after their answer.
        for server in getattr(self, "servers", []):
            server.close()
        for connection in list(self.server_state.connections):
            connection.shutdown()
        self.state.closing = True  # a request still arriving on an open connection: 503
        log.info("listener closed; %d items admitted", self.state.models.in_flight)
        self.should_exit = True  # uvicorn waits for the requests in flight, then the lifespan ends


def event_loop() -> str:
    """uvloop (libuv) when installed, else asyncio's own loop."""
    try:
        import uvloop  # noqa: F401

        return "uvloop"
    except ImportError:
        return "asyncio"


def listen(host: str, port: int) -> socket.socket:
    """The listening socket, bound before anything starts: a port in use is one clear error."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    sock.set_inheritable(True)
    return sock


def listen_url(sock: socket.socket) -> str:
    """The URL the bound socket serves (IPv6 hosts in brackets)."""
    host, port = sock.getsockname()[:2]
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def store_problem(store: Path) -> str | None:
    """Why the model store cannot be read, or None: checked before the port is bound, so an
    unreadable store is one clear line and a non-zero exit rather than a server never ready."""
    try:
        os.listdir(store)
    except OSError as exc:
        return exc.strerror or str(exc)
    return None


def serve(settings: Settings) -> int:
    logs.setup(settings.log_level)
    for name in unknown_variables(os.environ):
        log.warning("environment variable %s names no setting; ignored", name)
    problem = store_problem(settings.model_store)
    if problem:
        log.error("cannot read the model store %s: %s", settings.model_store, problem)
        return 1
    try:
        sock = listen(settings.host, settings.port)
    except OSError as exc:
        log.error("cannot listen on %s:%d: %s", settings.host, settings.port, exc.strerror or exc)
        return 1
    log.info("listening on %s", listen_url(sock))  # the bound port, also when SERVE_PORT=0 picked one
    # The event loop shares the GIL with the model threads, whose Python (search, scheduling)
    # holds it between ONNX Runtime calls. At the default 5 ms switch interval the loop waits up
    # to 5 ms after every socket call it makes, so under overload it reads requests too slowly to
    # refuse them and the kernel's backlog fills; 0.5 ms keeps it answering.
    sys.setswitchinterval(settings.gil_switch_interval_s)
    app: FastAPI = create_app(settings)
    config = uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        log_config=None,
        log_level=settings.log_level,
        access_log=False,  # service.access logs every request as JSON with its request id
        lifespan="on",
        timeout_graceful_shutdown=max(1, int(settings.drain_timeout_s)),
        server_header=False,
        # uvicorn would trust X-Forwarded-For from loopback; SERVE_TRUSTED_PROXY_HEADER decides instead
        proxy_headers=False,
        http=guarded_protocol(settings.header_timeout_s, settings.max_header_bytes),
        ws="none",  # no WebSocket routes: an upgrade request is an HTTP request (404/405 as JSON)
        loop=event_loop(),
        timeout_keep_alive=max(1, int(settings.keepalive_timeout_s)),
    )
    server = DrainingServer(config, app.state.serve)
    server.run(sockets=[sock])
    return 0 if server.started else 1
