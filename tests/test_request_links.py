"""A request's link to its connection: the server's protocol tells the app that the body has
arrived and that the client left; without a link the app watches `receive` itself. Either way a
client that leaves before its answer starts cancels the route, and a late body gets a 408."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import uvicorn
from starlette.types import Message, Receive, Scope, Send

from service.http.middleware import DISCONNECTED, LINK_KEY, BodyLimit, RequestLink
from service.http.table import MATCH_KEY, Route, RouteTable
from service.server import guarded_protocol


class HeldRoute:
    """A route that records what happened to it: started, cancelled, answered."""

    def __init__(self, answer_at_once: bool = False) -> None:
        self.started = asyncio.Event()
        self.release = asyncio.Event()
        self.cancelled = False
        self.answer_at_once = answer_at_once
        self.body = b""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        self.body = (await receive())["body"]
        if self.answer_at_once:
            await send({"type": "http.response.start", "status": 200, "headers": []})
        self.started.set()
        try:
            await self.release.wait()
        except asyncio.CancelledError:
            self.cancelled = True
            raise
        await send({"type": "http.response.body", "body": b"done"})


def scope_for(link: RequestLink | None) -> Scope:
    table = RouteTable([Route("/predict", ("POST",), _never, "predict")])
    scope: Scope = {
        "type": "http",
        "method": "POST",
        "path": "/predict",
        "headers": [(b"content-type", b"application/json")],
    }
    scope[MATCH_KEY] = table.match("POST", "/predict")
    if link is not None:
        scope[LINK_KEY] = link
    return scope


async def _never(call: Any) -> Any:
    raise AssertionError("not called: the test's own route stands behind the body limit")


class Client:
    """`receive` as a server gives it: the body, then nothing until the client leaves."""

    def __init__(self, body: bytes | None = b'{"texts": ["x"]}') -> None:
        self.body, self.gone = body, asyncio.Event()
        self.sent: list[Message] = []

    async def receive(self) -> Message:
        if self.body is not None:
            body, self.body = self.body, None
            return {"type": "http.request", "body": body, "more_body": False}
        await self.gone.wait()
        return {"type": "http.disconnect"}

    async def send(self, message: Message) -> None:
        self.sent.append(message)


async def leave_once_started(route: HeldRoute, linked: bool) -> tuple[Scope, Client, RequestLink | None]:
    """Runs `route` behind the body limit; once it has started, the client leaves (through the
    link, or by `receive` answering a disconnect); then the route is released. Ends with the request."""
    client = Client()
    link = RequestLink(lambda: True) if linked else None
    scope = scope_for(link)
    task = asyncio.ensure_future(BodyLimit(route, 1000)(scope, client.receive, client.send))
    await asyncio.wait_for(route.started.wait(), 5)
    if link is not None:
        link.lost()
    else:
        client.gone.set()
    await asyncio.sleep(0.01)
    route.release.set()
    await asyncio.wait_for(task, 5)  # ends without raising: a cancel was the client's
    return scope, client, link


@pytest.mark.parametrize("linked", [True, False], ids=["link", "watcher"])
def test_a_client_that_leaves_before_the_answer_cancels_the_route(linked: bool) -> None:
    route = HeldRoute()
    scope, client, link = asyncio.run(leave_once_started(route, linked))
    assert route.body == b'{"texts": ["x"]}' and route.cancelled and scope.get(DISCONNECTED)
    assert client.sent == []
    assert link is None or link.on_lost is None  # nothing left to call after the route ended


@pytest.mark.parametrize("linked", [True, False], ids=["link", "watcher"])
def test_a_client_that_leaves_after_the_answer_started_does_not_cancel_it(linked: bool) -> None:
    route = HeldRoute(answer_at_once=True)
    scope, client, _ = asyncio.run(leave_once_started(route, linked))
    assert not route.cancelled and not scope.get(DISCONNECTED)
    assert [m["type"] for m in client.sent] == ["http.response.start", "http.response.body"]


@pytest.mark.parametrize("linked", [True, False], ids=["link-body-pending", "no-link"])
def test_a_body_that_does_not_arrive_gets_408(linked: bool) -> None:
    async def main() -> tuple[HeldRoute, Client, float]:
        route, client = HeldRoute(), Client(body=None)  # headers only; the body never comes
        scope = scope_for(RequestLink(lambda: False) if linked else None)
        t0 = time.monotonic()
        await asyncio.wait_for(BodyLimit(route, 1000, body_timeout=0.1)(scope, client.receive, client.send), 5)
        return route, client, time.monotonic() - t0

    route, client, took = asyncio.run(main())
    assert not route.started.is_set() and 0.1 <= took < 2
    assert client.sent[0]["status"] == 408
    assert json.loads(client.sent[1]["body"])["type"] == "request_timeout"


# -- the server's side: uvicorn with the service's protocol ------------------------------------


@pytest.fixture(scope="module")
def echo_server() -> Iterator[tuple[int, list[tuple[bool, bool]], threading.Event]]:
    """uvicorn with the guarded protocol and an app that records each request's link (present,
    body arrived) and, for /wait, waits until the link reports the client gone."""
    seen: list[tuple[bool, bool]] = []
    lost = threading.Event()

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        link = scope.get(LINK_KEY)
        seen.append((isinstance(link, RequestLink), bool(link and link.body_arrived())))
        if scope["path"] == "/slow":  # answered a second later, whatever the client does
            await asyncio.sleep(1.0)
        elif scope["path"] == "/wait" and isinstance(link, RequestLink):
            gone = asyncio.Event()
            link.on_lost = gone.set
            await gone.wait()
            lost.set()
            return
        await receive()
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
        await send({"type": "http.response.body", "body": b"ok"})

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    config = uvicorn.Config(app, http=guarded_protocol(10.0), lifespan="off", log_level="warning")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    end = time.monotonic() + 10
    while not server.started:
        assert time.monotonic() < end, "server did not start"
        time.sleep(0.01)
    yield port, seen, lost
    server.should_exit = True
    thread.join(10)


def test_the_protocol_links_each_request_and_reports_a_client_that_left(
    echo_server: tuple[int, list[tuple[bool, bool]], threading.Event],
) -> None:
    port, seen, lost = echo_server
    body = b'{"texts": ["x"]}'
    head = b"POST /x HTTP/1.1\r\nhost: t\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n" % len(body)
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(head + body)
        assert s.recv(4096).startswith(b"HTTP/1.1 200")
        s.sendall(head)  # the next request on the same connection: its body comes later
        time.sleep(0.2)
        s.sendall(body)
        assert s.recv(4096).startswith(b"HTTP/1.1 200")
    assert seen[:2] == [(True, True), (True, False)]  # each request has its link; the second's body was late
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(head.replace(b"/x", b"/wait") + body)
        time.sleep(0.2)
    assert lost.wait(5), "the app was not told that the client left"


def test_a_pipelined_request_is_read_no_further_than_the_header_limit_ahead(
    echo_server: tuple[int, list[tuple[bool, bool]], threading.Event],
) -> None:
    """Headers that never end, pipelined behind a request being answered, stay in the socket (the
    sender blocks once the kernel's buffers are full) instead of filling the server's memory; once
    the answer is out, they are read under the limit: 431."""
    port = echo_server[0]
    body = b'{"texts": ["x"]}'
    head = b"POST /slow HTTP/1.1\r\nhost: t\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n" % len(body)
    filler = (b"x-pad: " + b"a" * 8000 + b"\r\n") * 16
    sent = 0
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(head + body + b"GET /x HTTP/1.1\r\nhost: t\r\n")
        s.settimeout(0.3)
        with contextlib.suppress(OSError):  # a timeout: the server stopped reading
            while sent < 64 << 20:
                s.sendall(filler)
                sent += len(filler)
        assert sent < 24 << 20, f"the server read {sent >> 20} MB of headers ahead"
        s.settimeout(5)
        answers = b""
        with contextlib.suppress(OSError):
            while chunk := s.recv(65536):
                answers += chunk
    assert answers.startswith(b"HTTP/1.1 200") and b"HTTP/1.1 431" in answers
