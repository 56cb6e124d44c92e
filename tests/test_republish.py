"""An in-place republish (`export.publish --force` over the served version): what is served is what
is on disk. The watcher or the repository API loads the changed folder as a new load of the same
version, or refuses it while the files loaded before keep serving; a figure is never read from a
folder that changed after it was checked."""

from __future__ import annotations

import copy
import shutil
import threading
from collections import Counter
from pathlib import Path

import httpx
import pytest
import torch
from tokenizers import Tokenizer

from export.model import Classifier
from export.publish import ExportOptions, export_model, staged_version
from export.tokenizer import encode_texts
from service.contract.graphs import pad
from service.store import scan
from tests.conftest import LABELS, sentences
from tests.helpers import metric, run_server, until

TEXTS = ["The red cat.", "A blue dog runs.", "A dog runs."]
REFUSED = 'inference_model_loads_total{model="tiny-clf",result="refused"}'


def republish_copy(store: Path, name: str, version: int, corrupt: str | None = None) -> None:
    """Publishes a copy of a version over itself as `--force` does (built aside, renamed into place)."""
    with staged_version(store, name, version, force=True) as tmp:
        shutil.copytree(store / name / str(version), tmp, dirs_exist_ok=True)
        if corrupt:
            data = bytearray((tmp / corrupt).read_bytes())
            data[len(data) // 2] ^= 0x55
            (tmp / corrupt).write_bytes(bytes(data))


def test_a_republished_folder_has_a_new_fingerprint(tiny_store: Path, tmp_path: Path) -> None:
    store = tmp_path / "store"
    shutil.copytree(tiny_store, store)
    first = {(e.name, e.version): e for e in scan(store)}
    again = {(e.name, e.version): e for e in scan(store)}
    assert all(first[k].same_files(again[k]) and first[k] == again[k] for k in first)  # nothing changed
    republish_copy(store, "tiny-clf", 1)
    after = {(e.name, e.version): e for e in scan(store)}
    assert after[("tiny-clf", 1)].manifest == first[("tiny-clf", 1)].manifest  # the same bytes, a new folder
    assert not after[("tiny-clf", 1)].same_files(first[("tiny-clf", 1)])
    assert after[("tiny-mt", 1)].same_files(first[("tiny-mt", 1)])
    assert sorted(p.name for p in store.iterdir()) == ["tiny-clf", "tiny-mt"]  # the old folder is gone
    manifest = store / "tiny-mt" / "1" / "manifest.json"
    manifest.write_text(manifest.read_text().replace('"tiny-mt"', '"tiny-mt" '))  # edited in place
    assert not scan(store)[1].same_files(after[("tiny-mt", 1)])


def retrained(classifier: Classifier, tokenizer: Tokenizer, store: Path, run: Path) -> list[str]:
    """Publishes tiny-clf version 1 again with different weights (the head negated) and a figure
    the first publication lacks; returns the labels the new weights give `TEXTS`."""
    model = copy.deepcopy(classifier).eval()
    with torch.no_grad():
        model.head.weight.neg_()
        model.head.bias.neg_()
        ids, mask = (torch.from_numpy(a) for a in pad(encode_texts(tokenizer, TEXTS, model.config.max_len)))
        labels = [LABELS[i] for i in model(ids, mask).argmax(-1).tolist()]
    curves = run / "curves.png"
    shutil.copy(store / "tiny-mt" / "1" / "curves.png", curves)
    options = ExportOptions(
        "tiny-clf", 1, variants=("fp32",), labels=tuple(LABELS), force=True, figures=(curves,), min_parity_sentences=20
    )
    export_model(model, tokenizer, store, options, validation_texts=sentences(40, seed=7), log=lambda _: None)
    return labels


@pytest.mark.slow
@pytest.mark.parametrize("how", ["watcher", "load"])
def test_a_republished_version_serves_its_new_weights(
    tiny_store: Path, tmp_path: Path, tiny_classifier: Classifier, tiny_tokenizer: Tokenizer, how: str
) -> None:
    store = tmp_path / "store"
    shutil.copytree(tiny_store, store)
    statuses: Counter[tuple[str, int]] = Counter()
    stop = threading.Event()

    def client(url: str) -> None:
        with httpx.Client(base_url=url, timeout=30) as c:
            while not stop.is_set():
                statuses["predict", c.post("/predict", json={"texts": TEXTS}).status_code] += 1
                statuses["figure", c.get("/v1/models/tiny-clf/figures/positions").status_code] += 1

    settings = {"watch_interval_s": "0.2"} if how == "watcher" else {"model_control": "explicit"}
    with run_server(store, tmp_path / "server.log", **settings) as server, httpx.Client(base_url=server.url) as c:

        def labels() -> list[str]:
            r = c.post("/predict", json={"texts": TEXTS})
            assert r.status_code == 200 and r.json()["version"] == 1
            return [p["label"] for p in r.json()["predictions"]]

        def reload() -> httpx.Response:
            return c.post("/v2/repository/models/tiny-clf/load", timeout=60)

        assert labels() == ["positive", "negative", "neutral"]
        assert c.get("/v1/models/tiny-clf/figures/curves").status_code == 404
        threads = [threading.Thread(target=client, args=(server.url,)) for _ in range(2)]
        for t in threads:
            t.start()
        try:
            new = retrained(tiny_classifier, tiny_tokenizer, store, tmp_path)
            assert new != ["positive", "negative", "neutral"]
            if how == "load":
                r = reload()
                assert r.status_code == 200 and r.json() == {}
                assert labels() == new  # at once: the load was synchronous
            until("the new weights served", lambda: labels() == new)
            assert c.get("/v1/models/tiny-clf/figures/curves").status_code == 200
            before = metric(c.get("/metrics").text, REFUSED)
            republish_copy(store, "tiny-clf", 1, corrupt="model.onnx")
            if how == "load":
                r = reload()
                assert r.status_code == 409
                assert "changed on disk" in r.json()["error"] and "model.onnx" in r.json()["error"]
            until("the broken republish refused", lambda: metric(c.get("/metrics").text, REFUSED) == before + 1)
            answered = sum(statuses.values())
            until("more answers", lambda: sum(statuses.values()) >= answered + 20)
            assert labels() == new  # the files loaded before keep serving
            assert metric(c.get("/metrics").text, REFUSED) == before + 1  # said once, not at every scan
        finally:
            stop.set()
            for t in threads:
                t.join(30)
    assert {status for _, status in statuses} == {200}, statuses  # no request lost, no figure read a changed file
    log = (tmp_path / "server.log").read_text()
    assert log.count("changed on disk and is refused") == 1
