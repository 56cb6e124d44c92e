"""Promises of the documentation, each kept by a real server process on loopback.

A translation is held in flight by the fault hook's decoder gate (`bench/faults/sitecustomize.py`,
`FAULT_DECODE_GATE`): while the gate file exists every decoder call waits, and the server logs
that it does. The tests wait on that log line, on readiness and on metrics, never on a clock.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from bench.serverproc import ROOT
from tests.conftest import sentences
from tests.helpers import Server, fault_hook_path, run_server
from tests.tiny import expected_translation

pytestmark = pytest.mark.slow  # real server processes, a few seconds each: left out of `make test-fast`

HELD = "FAULT gate: decoder call held"
PATIENCE = 60.0  # seconds any condition may take on a loaded machine before the test fails


def fault_env(gate: Path) -> dict[str, str]:
    return {
        "PYTHONPATH": fault_hook_path(),
        "FAULT_DECODE_GATE": str(gate),
    }


def wait_for(what: str, condition: Callable[[], bool], timeout: float = PATIENCE) -> None:
    end = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < end, f"waited {timeout:.0f} s for {what}"
        time.sleep(0.02)


def held_count(server: Server) -> int:
    return server.log_text().count(HELD)


def _gauge(server: Server, name: str) -> float:
    text = httpx.get(server.url + "/metrics", timeout=30).text
    return sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith(name))


@contextlib.contextmanager
def gate_closed(server: Server, gate: Path) -> Iterator[Callable[[], None]]:
    """Holds every decoder call until the block ends; yields a function that waits until one is
    held. On leaving, the held work runs out and the test waits until no sentence is left."""
    before = held_count(server)
    gate.touch()
    try:
        yield lambda: wait_for("a decoder call held at the gate", lambda: held_count(server) > before)
    finally:
        gate.unlink(missing_ok=True)
    for name in ("inference_active_sequences", "inference_queue_depth"):
        wait_for(f"{name} 0", lambda n=name: _gauge(server, n + '{model="tiny-mt"}') == 0)  # type: ignore[misc]


@pytest.fixture(scope="module")
def gate(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("gate") / "closed"


@pytest.fixture(scope="module")
def server(tiny_store: Path, gate: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """One request in flight at most; the server's own deadline (60 s) far beyond any test's."""
    log = tmp_path_factory.mktemp("promises") / "server.log"
    with run_server(tiny_store, log, env=fault_env(gate), max_in_flight="1", request_timeout_s="60") as s:
        yield s


def test_timeout_ms_shortens_the_request_deadline(server: Server, gate: Path) -> None:
    with gate_closed(server, gate), httpx.Client(base_url=server.url, timeout=PATIENCE) as c:
        t0 = time.monotonic()
        r = c.post("/translate", json={"texts": ["The cat sees a dog."], "timeout_ms": 500})
        elapsed = time.monotonic() - t0
        assert r.status_code == 504 and r.json()["type"] == "deadline_exceeded", r.text
        assert 0.5 <= elapsed < 30, elapsed  # its own deadline, not the server's 60 s
    ok = httpx.post(server.url + "/translate", json={"texts": ["The cat sees a dog."]}, timeout=PATIENCE)
    assert ok.json()["translations"][0]["text"] == expected_translation("The cat sees a dog.")


def test_oip_parameters_timeout_shortens_the_request_deadline(server: Server, gate: Path) -> None:
    text = {"name": "text", "datatype": "BYTES", "shape": [1], "data": ["A big red house."]}
    body = {"inputs": [text], "parameters": {"timeout": 500_000}}  # microseconds, as Triton's
    with gate_closed(server, gate), httpx.Client(base_url=server.url, timeout=PATIENCE) as c:
        t0 = time.monotonic()
        r = c.post("/v2/models/tiny-mt/infer", json=body)
        elapsed = time.monotonic() - t0
        assert r.status_code == 504 and "deadline" in r.json()["error"], r.text
        assert 0.5 <= elapsed < 30, elapsed
    r = httpx.post(server.url + "/v2/models/tiny-mt/infer", json={"inputs": [text]}, timeout=PATIENCE)
    assert r.json()["outputs"][0]["data"] == [expected_translation("A big red house.")]


def test_beyond_the_in_flight_limit_a_request_gets_503_with_retry_after(server: Server, gate: Path) -> None:
    text = "The small blue window."
    with ThreadPoolExecutor(1) as pool, httpx.Client(base_url=server.url, timeout=PATIENCE) as c:
        with gate_closed(server, gate) as wait_held:
            first: Future[httpx.Response] = pool.submit(c.post, "/translate", json={"texts": [text]})
            wait_held()
            r = c.post("/predict", json={"texts": ["A red cat."]})
            assert r.status_code == 503 and int(r.headers["retry-after"]) >= 1, r.text
            assert r.json()["type"] == "overloaded", r.text
            assert c.get("/readyz").status_code == 200  # probes are exempt
        done = first.result(timeout=PATIENCE)
        assert done.status_code == 200 and done.json()["translations"][0]["text"] == expected_translation(text)


def test_lines_and_protected_spans_survive_the_server(server: Server) -> None:
    text = (
        "The cat sees https://example.org/cat?dog=1 a dog. Open the window.\n"
        "\n"
        "  Open the file config.ini --force save.\r\n"
        "A big dog runs 42 <br/> %s.\n"
        "Red ⟨1⟩ house {name} a@b.de window.\n"
    )
    want = expected_translation(text)
    assert want.startswith("Window save tree https://example.org/cat?dog=1 close open. Dog window the.\n\n  Dog")
    with httpx.Client(base_url=server.url, timeout=PATIENCE) as c:
        r = c.post("/translate", json={"texts": [text, "The red house."]})
        assert r.status_code == 200, r.text
        assert [t["text"] for t in r.json()["translations"]] == [want, expected_translation("The red house.")]


def test_a_bad_setting_exits_2_naming_its_variable(tiny_store: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SERVE_")}
    env |= {"SERVE_MODEL_STORE": str(tiny_store), "SERVE_PORT": "0", "SERVE_MAX_IN_FLIGHT": "0"}
    done = subprocess.run(
        [sys.executable, "-m", "service"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=PATIENCE
    )
    assert done.returncode == 2, done.stderr
    assert "SERVE_MAX_IN_FLIGHT" in done.stderr and "Traceback" not in done.stderr


def test_sigterm_fails_readiness_serves_the_grace_then_drains_and_exits_0(tiny_store: Path, tmp_path: Path) -> None:
    gate = tmp_path / "closed"
    text = sentences(1, seed=3)[0]
    settings = {"drain_timeout_s": "120", "drain_grace_s": "3"}
    with run_server(tiny_store, tmp_path / "server.log", env=fault_env(gate), **settings) as s:
        with ThreadPoolExecutor(1) as pool, httpx.Client(base_url=s.url, timeout=PATIENCE) as c:
            before = held_count(s)
            gate.touch()
            admitted = pool.submit(c.post, "/translate", json={"texts": [text], "beam_size": 4})
            wait_for("the translation held in the decoder", lambda: held_count(s) > before)
            s.proc.send_signal(signal.SIGTERM)
            wait_for("not ready", lambda: c.get("/readyz").status_code == 503)
            assert c.get("/readyz").json()["type"] == "shutting_down"
            # the grace: a load balancer has not noticed yet, and what it still sends is served
            assert c.post("/predict", json={"texts": ["A red cat."]}).status_code == 200
            with httpx.Client(base_url=s.url, timeout=5) as fresh:
                assert fresh.post("/predict", json={"texts": ["A red cat."]}).status_code == 200

            def refused() -> bool:  # after the grace the listener is closed
                try:
                    httpx.get(s.url + "/healthz", timeout=2)
                except httpx.TransportError:
                    return True
                return False

            wait_for("the listener closed", refused)
            assert s.proc.poll() is None  # still draining: the admitted translation holds it
            gate.unlink()
            done = admitted.result(timeout=PATIENCE)
            assert done.status_code == 200, done.text
            assert done.json()["translations"][0]["text"] == expected_translation(text)
        assert s.proc.wait(PATIENCE) == 0
