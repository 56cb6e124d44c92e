"""Hot reload under load: a new version appears in the store while clients keep sending requests."""

from __future__ import annotations

import shutil
import threading
import time
from collections import Counter
from pathlib import Path

import httpx
import pytest

from tests.helpers import add_version, metric, run_server, until
from tests.tiny import expected_translation

pytestmark = pytest.mark.slow  # real server processes, a few seconds each: left out of `make test-fast`


def refused(url: str) -> float:
    text = httpx.get(url + "/metrics", timeout=30).text
    return metric(text, 'inference_model_loads_total{model="tiny-mt",result="refused"}')


def listed(url: str) -> set[int]:
    models = httpx.get(url + "/v1/models", timeout=30).json()["data"]
    return {m["version"] for m in models if m["name"] == "tiny-mt"}


def test_a_new_version_takes_over_without_losing_a_request(tiny_store: Path, tmp_path: Path) -> None:
    store = tmp_path / "store"
    shutil.copytree(tiny_store, store)
    statuses: Counter[int] = Counter()
    versions: list[int] = []
    after_switch: list[int] = []  # versions of the requests sent once an answer came from version 2
    texts: set[str] = set()
    stop, switched = threading.Event(), threading.Event()

    def client(url: str) -> None:
        with httpx.Client(base_url=url, timeout=30) as c:
            while not stop.is_set():
                sent_after = switched.is_set()  # a request sent earlier may still run on version 1
                r = c.post("/translate", json={"texts": ["The cat sees a dog."], "decode": "greedy"})
                statuses[r.status_code] += 1
                if r.status_code == 200:
                    versions.append(r.json()["version"])
                    texts.add(r.json()["translations"][0]["text"])
                    if versions[-1] == 2:
                        switched.set()
                    if sent_after:
                        after_switch.append(versions[-1])

    with run_server(store, tmp_path / "server.log", watch_interval_s="0.2") as server:
        threads = [threading.Thread(target=client, args=(server.url,)) for _ in range(3)]
        for t in threads:
            t.start()
        try:
            until("traffic on version 1", lambda: len(versions) >= 3)
            add_version(store / "tiny-mt", 1, 2)
            until("version 2 served", lambda: bool(versions) and versions[-1] == 2)
            until("more answers", lambda: len(after_switch) >= 6)
            assert set(after_switch) == {2}  # every request sent after the switch: the new version
            add_version(store / "tiny-mt", 2, 3, corrupt="decoder.onnx")
            until("version 3 refused", lambda: refused(server.url) == 1)
            after = len(versions)
            until("answers after the refusal", lambda: len(versions) >= after + 3)
            until("version 1 unloaded", lambda: 1 not in listed(server.url))
        finally:
            stop.set()
            for t in threads:
                t.join(30)
        with httpx.Client(base_url=server.url, timeout=30) as c:
            models = c.get("/v1/models").json()["data"]
            metrics = c.get("/metrics").text
    assert set(statuses) == {200}, statuses  # nothing failed or was dropped during the switch
    assert texts == {expected_translation("The cat sees a dog.")}
    assert versions[-1] == 2  # the corrupt version 3 was refused; 2 kept serving
    mt = {m["version"]: m for m in models if m["name"] == "tiny-mt"}
    assert mt[2]["status"] == "ready" and mt[2]["current"] is True
    assert mt[3]["status"] == "refused" and "decoder.onnx" in mt[3]["error"]
    assert 1 not in mt  # the old version finished its work and was unloaded
    assert metric(metrics, 'inference_model_loads_total{model="tiny-mt",result="refused"}') == 1
    assert metric(metrics, 'inference_model_loads_total{model="tiny-mt",result="loaded"}') == 1


@pytest.mark.parametrize("pinned", [True, False])
def test_version_policy_and_repository_api(tiny_store: Path, tmp_path: Path, pinned: bool) -> None:
    store = tmp_path / "store"
    shutil.copytree(tiny_store, store)
    add_version(store / "tiny-clf", 1, 2)
    settings = {"model_control": "explicit"} | ({"model_versions": "tiny-clf=1"} if pinned else {})
    with run_server(store, tmp_path / "server.log", **settings) as server, httpx.Client(base_url=server.url) as c:
        want = 1 if pinned else 2
        assert c.post("/predict", json={"texts": ["fine"]}).json()["version"] == want
        r = c.post("/predict", json={"texts": ["fine"], "version": 3 - want})
        assert r.status_code == 404 and "no loaded version" in r.json()["error"]
        assert c.post("/v2/repository/models/tiny-clf/unload").status_code == 200
        r = c.post("/predict", json={"texts": ["fine"], "model": "tiny-clf"})
        assert r.status_code == 503
        index = c.post("/v2/repository/index").json()
        assert {"name": "tiny-mt", "version": "1", "state": "READY", "reason": ""} in index
        assert not [m for m in index if m["name"] == "tiny-clf" and m["state"] == "READY"]
        assert c.post("/v2/repository/models/tiny-clf/load").status_code == 200
        assert c.post("/predict", json={"texts": ["fine"]}).json()["version"] == want
        r = c.post("/v2/repository/models/nope/load")
        assert r.status_code == 404 and set(r.json()) == {"error"}


def test_lifecycle_answers_agree(tiny_store: Path, tmp_path: Path) -> None:
    """Unloaded: the same 503 named or not, gone from /readyz; the index lists every folder on disk with
    its state and reason; a broken folder is reported once with all its problems, not at every scan."""
    store = tmp_path / "store"
    shutil.copytree(tiny_store, store)
    add_version(store / "tiny-clf", 1, 2)
    log = tmp_path / "server.log"
    with (
        run_server(store, log, watch_interval_s="0.2", model_control="explicit") as server,
        httpx.Client(base_url=server.url) as c,
    ):

        def index() -> dict[tuple[str, str], tuple[str, str]]:
            r = c.post("/v2/repository/index")
            return {(m["name"], m["version"]): (m["state"], m["reason"]) for m in r.json()}

        assert index()[("tiny-clf", "1")] == ("UNAVAILABLE", "not loaded: version 2 serves")
        assert index()[("tiny-clf", "2")] == ("READY", "")
        assert c.post("/v2/repository/models/tiny-clf/unload").status_code == 200
        named = c.post("/predict", json={"texts": ["fine"], "model": "tiny-clf"})
        unnamed = c.post("/predict", json={"texts": ["fine"]})
        assert named.status_code == unnamed.status_code == 503
        assert named.json() == unnamed.json() == {"error": "model tiny-clf is unloaded", "type": "not_ready"}
        ready = c.get("/readyz")
        assert ready.status_code == 200 and ready.json()["models"] == ["tiny-mt"]
        assert {v for (n, _), v in index().items() if n == "tiny-clf"} == {
            ("UNAVAILABLE", "not loaded: the model is unloaded")
        }
        # copied by hand: wrong number, and a file lost on the way; put in place at once, so the
        # watcher (every 0.2 s) never scans a half-made copy, which would be a second problem
        copy = tmp_path / "copy"
        shutil.copytree(store / "tiny-clf" / "2", copy)
        (copy / "tokenizer.json").unlink()
        copy.rename(store / "tiny-clf" / "3")
        assert c.post("/v2/repository/models/tiny-clf/load").status_code == 200
        assert c.post("/predict", json={"texts": ["fine"]}).json()["version"] == 2
        state, reason = index()[("tiny-clf", "3")]
        assert state == "UNAVAILABLE" and "manifest says version 2" in reason
        assert "missing file tokenizer.json" in reason
        time.sleep(1.5)  # several watcher scans
        lines = [line for line in log.read_text().splitlines() if "not served" in line and "tiny-clf/3" in line]
        assert len(lines) == 1, lines
