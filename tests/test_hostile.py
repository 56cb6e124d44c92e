"""Hostile clients against a real server: idle and slow connections are bounded by timeouts that
are settings, oversized headers are refused, pipelined requests are answered in order."""

from __future__ import annotations

import gzip
import json
import socket
import time
import zlib
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.helpers import Server, run_server

pytestmark = pytest.mark.slow  # real server processes, a few seconds each: left out of `make test-fast`


@pytest.fixture(scope="module")
def server(tiny_store: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    log = tmp_path_factory.mktemp("hostile") / "server.log"
    settings = {"header_timeout_s": "0.5", "body_timeout_s": "0.5", "keepalive_timeout_s": "1"}
    with run_server(tiny_store, log, max_in_flight="8", max_queue="64", **settings) as s:
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
        assert closed_within(sock, 2)  # what comes next on it could be the rest of that body
    assert answer.startswith("HTTP/1.1 408") and "connection: close" in answer.lower()
    assert json.loads(answer.split("\r\n\r\n", 1)[1])["type"] == "request_timeout"


def test_stalled_bodies_keep_no_one_else_out(server: Server) -> None:
    """More stalled uploads than requests may be in flight (8 here): others are still served."""
    head = b"POST /predict HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n"
    stalled = [connect(server) for _ in range(12)]
    try:
        for sock in stalled:
            sock.sendall(head)
        time.sleep(0.1)
        r = httpx.post(server.url + "/predict", json={"texts": ["fine"]}, timeout=5)
        assert r.status_code == 200, r.text
    finally:
        for sock in stalled:
            sock.close()


def test_an_answer_before_a_body_the_client_holds_back_closes_the_connection(server: Server) -> None:
    """Expect: 100-continue and a body over the limit: the 413 comes at once, and the connection
    closes (the client never sends that body; a next request would be read as it)."""
    with connect(server) as sock:
        sock.sendall(
            b"POST /predict HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Expect: 100-continue\r\nContent-Length: 500000000\r\n\r\n"
        )
        answer = read_response(sock)
        assert answer.startswith("HTTP/1.1 413") and "connection: close" in answer.lower()
        assert closed_within(sock, 2)


@pytest.mark.parametrize(
    "request_bytes",
    [
        b"POST /predict HTTP/1.1\r\nHost: x\r\nContent-Length: -1\r\n\r\n",
        b"FOO /predict HTTP/1.1\r\nHost: x\r\n\r\n",
        b"POST /predict HTTP/1.1\r\nHost: x\r\nContent-Length: \xc2\xb2\r\n\r\n",
    ],
    ids=["negative-length", "unknown-method", "non-ascii-digit"],
)
def test_what_the_parser_refuses_is_a_json_error(server: Server, request_bytes: bytes) -> None:
    with connect(server) as sock:
        sock.sendall(request_bytes)
        answer = read_response(sock)
    assert answer.startswith("HTTP/1.1 4") and "application/json" in answer
    assert json.loads(answer.split("\r\n\r\n", 1)[1])["error"]


def test_a_websocket_upgrade_is_an_http_request(server: Server) -> None:
    with connect(server) as sock:
        sock.sendall(
            b"GET /ws HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
        )
        answer = read_response(sock)
    assert answer.startswith("HTTP/1.1 404") and json.loads(answer.split("\r\n\r\n", 1)[1])["type"] == "not_found"


def test_more_sentences_than_the_queue_holds_is_413_not_a_retry(server: Server) -> None:
    text = " ".join(["A dog runs."] * 70)  # 70 sentences; the queue holds 64
    r = httpx.post(server.url + "/translate", json={"texts": [text]}, timeout=10)
    assert r.status_code == 413 and r.json()["type"] == "payload_too_large" and "retry-after" not in r.headers
    assert "queues at most 64" in r.json()["error"]


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


def test_a_non_ascii_digit_as_the_binary_header_length_is_422(server: Server) -> None:
    headers = {"content-type": "application/octet-stream", "inference-header-content-length": b"\xb2"}  # "²" in Latin-1
    r = httpx.post(server.url + "/v2/models/tiny-clf/infer", content=b'{"inputs": []}', headers=headers, timeout=5)
    assert r.status_code == 422 and "Inference-Header-Content-Length" in r.json()["error"]


@pytest.mark.parametrize(
    ("encoding", "body", "status"),
    [
        ("gzip", gzip.compress(b'{"texts": ["fine"]}'), 200),
        ("deflate", zlib.compress(b'{"texts": ["fine"]}'), 200),
        ("gzip", gzip.compress(b'{"texts": ["' + b"a" * 50_000_000 + b'"]}'), 413),  # 50 kB unpacking to 50 MB
        ("gzip", b"not gzip at all", 400),
        ("br", b'{"texts": ["fine"]}', 415),
    ],
    ids=["gzip", "deflate", "bomb", "not-gzip", "brotli"],
)
def test_a_compressed_body_is_undone_within_the_limit(server: Server, encoding: str, body: bytes, status: int) -> None:
    headers = {"content-type": "application/json", "content-encoding": encoding}
    r = httpx.post(server.url + "/predict", content=body, headers=headers, timeout=10)
    assert r.status_code == status, r.text
    assert r.json().get("predictions") if status == 200 else r.json()["error"]
