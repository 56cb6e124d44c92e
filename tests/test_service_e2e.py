"""`python -m service` as a real uvicorn process on a free loopback port, over the tiny store."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from tests.helpers import ROOT, Server, fault_hook_path, metric, run_server
from tests.tiny import expected_translation


@pytest.fixture(scope="module")
def server(tiny_store: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    with run_server(tiny_store, tmp_path_factory.mktemp("e2e") / "server.log") as s:
        yield s


def test_real_server_answers_the_contract(server: Server) -> None:
    with httpx.Client(base_url=server.url, timeout=30) as c:
        texts = ["The red cat.", "A blue dog runs.", "A dog runs."]
        r = c.post("/predict", json={"texts": texts}, headers={"X-Request-ID": "e2e-1"})
        assert r.status_code == 200 and r.headers["x-request-id"] == "e2e-1"
        assert [p["label"] for p in r.json()["predictions"]] == ["positive", "negative", "neutral"]
        r = c.post("/translate", json={"texts": texts, "beam_size": 2, "return_scores": True})
        assert r.status_code == 200
        assert [t["text"] for t in r.json()["translations"]] == [expected_translation(t) for t in texts]
        assert all(-1.0 < t["score"] <= 0.0 for t in r.json()["translations"])  # log-probabilities, near sure
        oip = {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [2], "data": texts[:2]}]}
        out = c.post("/v2/models/tiny-mt/infer", json=oip).json()["outputs"][0]
        assert out["shape"] == [2] and out["data"] == [expected_translation(t) for t in texts[:2]]
        r = c.post("/translate", json={"texts": ["a"], "beam_size": 0})
        assert r.status_code == 422 and r.json()["type"] == "invalid_input"

        def chunks() -> Iterator[bytes]:  # no Content-Length: chunked transfer, counted on the stream
            yield b'{"texts": ["'
            for _ in range(40):
                yield b"a" * 32768
            yield b'"]}'

        r = c.post("/predict", content=chunks(), headers={"content-type": "application/json"})
        assert r.status_code == 413 and r.json()["type"] == "payload_too_large"
        assert c.post("/predict", json={"texts": ["still serving"]}).status_code == 200
        metrics = c.get("/metrics").text
        assert 'inference_requests_total{endpoint="/predict",model="tiny-clf",status="200"}' in metrics
    access = [x for x in server.lines() if x.get("logger") == "service.access"]
    hit = [x for x in access if x.get("request_id") == "e2e-1"]
    assert hit and hit[0]["path"] == "/predict" and hit[0]["status"] == 200 and hit[0]["model"] == "tiny-clf"


def test_abandoned_requests_leave_the_running_batch(server: Server) -> None:
    heavy = {"texts": [f"The small cat {i} sees a big red dog." for i in range(64)], "beam_size": 8}
    with ThreadPoolExecutor(10) as pool:

        def abandon(_: int) -> None:
            with contextlib.suppress(httpx.TimeoutException), httpx.Client(base_url=server.url, timeout=0.3) as c:
                c.post("/translate", json=heavy)

        list(pool.map(abandon, range(10)))
    with httpx.Client(base_url=server.url, timeout=30) as c:
        end = time.monotonic() + 60  # generous: a loaded machine, not a latency bound
        while True:
            metrics = c.get("/metrics").text
            active = metric(metrics, 'inference_active_sequences{model="tiny-mt"}')
            waiting = metric(metrics, 'inference_queue_depth{model="tiny-mt"}')
            if active == 0 and waiting == 0:
                break
            assert time.monotonic() < end, (active, waiting)
            time.sleep(0.05)
        assert metric(metrics, 'inference_cancelled_sentences_total{model="tiny-mt",reason="disconnect"}') > 0
        assert c.post("/translate", json={"texts": ["The cat."]}).status_code == 200
    access = [x for x in server.lines() if x.get("logger") == "service.access" and x.get("path") == "/translate"]
    assert any(x["status"] == 499 for x in access)


def test_a_port_in_use_is_one_clear_line_and_exit_1(server: Server, tiny_store: Path) -> None:
    port = server.url.rsplit(":", 1)[1]
    env = {k: v for k, v in os.environ.items() if not k.startswith("SERVE_")}
    env |= {"SERVE_MODEL_STORE": str(tiny_store), "SERVE_PORT": port}
    done = subprocess.run(
        [sys.executable, "-m", "service"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 1
    lines = [json.loads(line) for line in done.stderr.splitlines() if line.strip()]
    assert [x["msg"] for x in lines if x["level"] == "error"] == [
        f"cannot listen on 127.0.0.1:{port}: Address already in use"
    ]
    assert "Traceback" not in done.stderr


def test_an_unreadable_store_is_one_clear_line_and_exit_1(tiny_store: Path) -> None:
    """File modes do not stop root, so the store is made unreadable by the campaign's fault hook
    (bench/faults/sitecustomize.py), as a store the server's user may not list."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SERVE_")}
    env |= {"SERVE_MODEL_STORE": str(tiny_store), "SERVE_PORT": "0", "FAULT_UNREADABLE": str(tiny_store)}
    env["PYTHONPATH"] = fault_hook_path()
    done = subprocess.run(
        [sys.executable, "-m", "service"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 1
    lines = [json.loads(line) for line in done.stderr.splitlines() if line.strip()]
    assert [x["msg"] for x in lines] == [f"cannot read the model store {tiny_store}: Permission denied"]


def test_the_start_up_log_names_the_bound_url_when_the_port_is_0(tiny_store: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SERVE_")}
    env |= {"SERVE_MODEL_STORE": str(tiny_store), "SERVE_PORT": "0", "SERVE_THREADS": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "service"], cwd=ROOT, env=env, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        assert proc.stderr is not None
        url = None
        for line in proc.stderr:  # the line comes before the models load
            msg = json.loads(line)["msg"] if line.startswith("{") else ""
            if msg.startswith("listening on "):
                url = msg.removeprefix("listening on ")
                break
        assert url is not None and not url.endswith(":0")
        deadline = time.monotonic() + 60  # the port is bound first; uvicorn accepts once it has started
        while True:
            try:
                with httpx.Client(timeout=10) as c:
                    assert c.get(f"{url}/healthz").status_code == 200
                break
            except httpx.ConnectError:
                assert time.monotonic() < deadline and proc.poll() is None
                time.sleep(0.2)
    finally:
        proc.terminate()
        proc.wait(30)
