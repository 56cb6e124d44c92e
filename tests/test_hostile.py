"""Hostile clients against a real server: idle and slow connections are bounded by timeouts that
are settings, oversized headers are refused, pipelined requests are answered in order."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.test_service_e2e import Server, run_server


@pytest.fixture(scope="module")
def server(tiny_store: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    log = tmp_path_factory.mktemp("hostile") / "server.log"
    with run_server(tiny_store, log, header_timeout_s="0.5", body_timeout_s="0.5", keepalive_timeout_s="1") as s:
        yield s


def connect(server: Server) -> socket.socket:
    host, port = server.url.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)), timeout=5)
    return sock


def closed_within(sock: socket.socket, seconds: float) -> bool:
    """True when the server closes the connection (reads EOF) within `seconds`."""
    sock.settimeout(seconds)
    try:
        while sock.recv(65536):
            pass
        return True
    except TimeoutError:
        return False


def test_a_silent_connection_is_closed(server: Server) -> None:
    with connect(server) as sock:
        t0 = time.monotonic()
        assert closed_within(sock, 5)
        assert time.monotonic() - t0 < 3


def test_headers_sent_a_byte_at_a_time_are_cut_off(server: Server) -> None:
    with connect(server) as sock:
        t0 = time.monotonic()
        for byte in b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 100:
            try:
                sock.sendall(bytes([byte]))
            except (BrokenPipeError, ConnectionResetError):
                break
            time.sleep(0.05)
            if time.monotonic() - t0 > 4:
                break
        assert closed_within(sock, 2)
        assert time.monotonic() - t0 < 4


def test_a_body_that_stalls_gets_408(server: Server) -> None:
    with connect(server) as sock:
        head = b"POST /predict HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n"
        sock.sendall(head + b'{"texts": ["a')
        answer = read_response(sock)
    assert answer.startswith("HTTP/1.1 408")
    assert json.loads(answer.split("\r\n\r\n", 1)[1])["type"] == "request_timeout"


def read_response(sock: socket.socket) -> str:
    """One whole HTTP response (its body by Content-Length)."""
    sock.settimeout(5)
    data = b""
    while b"\r\n\r\n" not in data:
        data += sock.recv(65536)
    head, body = data.split(b"\r\n\r\n", 1)
    length = int(
        next(v for k, v in (h.split(b": ", 1) for h in head.split(b"\r\n")[1:]) if k.lower() == b"content-length")
    )
    while len(body) < length:
        body += sock.recv(65536)
    return (head + b"\r\n\r\n" + body).decode()


def test_oversized_headers_are_refused_and_serving_goes_on(server: Server) -> None:
    with connect(server) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 200_000 + b"\r\n\r\n")
        sock.settimeout(5)
        try:
            answer = sock.recv(65536).decode(errors="replace")
        except ConnectionResetError:
            answer = ""
    assert answer == "" or answer.startswith(("HTTP/1.1 400", "HTTP/1.1 431"))
    assert httpx.get(server.url + "/healthz").status_code == 200


def test_pipelined_requests_are_answered_in_order(server: Server) -> None:
    body = b'{"texts": ["fine"]}'
    post = b"POST /predict HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(
        body
    )
    with connect(server) as sock:
        sock.sendall(
            b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"
            + post
            + body
            + b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n"
        )
        sock.settimeout(5)
        data = b""
        while data.count(b"HTTP/1.1 200") < 3 or not data.endswith(b"}"):
            chunk = sock.recv(65536)
            assert chunk, data
            data += chunk
    bodies = [part for part in data.split(b"HTTP/1.1 200 OK")[1:]]
    assert b'"status":"ok"' in bodies[0] and b"predictions" in bodies[1] and b'"live":true' in bodies[2]


def test_after_a_body_answered_early_the_connection_serves_the_next_request(server: Server) -> None:
    """The rest of a chunked body the server refused (413) is skipped, not read as the next
    request's headers (that once gave a spurious 431 now and then)."""

    def chunks() -> Iterator[bytes]:
        yield b'{"texts": ["'
        for _ in range(40):
            yield b"a" * 32768
        yield b'"]}'

    statuses = []
    with httpx.Client(base_url=server.url, timeout=30) as c:
        for _ in range(20):
            statuses.append(
                c.post("/predict", content=chunks(), headers={"content-type": "application/json"}).status_code
            )
            statuses.append(c.post("/predict", json={"texts": ["still serving"]}).status_code)
    assert statuses == [413, 200] * 20
