"""Training pictures in the store: written and pinned by the export, served for the serving version."""

from __future__ import annotations

import contextlib
import json
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from tokenizers import Tokenizer

from export import figures as figures_lib
from export import publish as exporter
from export.model import Classifier
from export.train import save_checkpoint
from export.validate import ExportError
from service.app import create_app
from service.contract.manifest import ManifestError, read_manifest, sha256_file, verify_folder
from service.settings import Settings
from tests.conftest import LABELS, sentences

PNG = b"\x89PNG\r\n\x1a\n"


@contextlib.contextmanager
def ready_client(store: Path) -> Iterator[TestClient]:
    with TestClient(create_app(Settings(model_store=store, threads=1, model_thread_priority="nice"))) as client:
        end = time.monotonic() + 120  # generous: a busy machine is slow, not wrong
        while client.get("/readyz").status_code != 200:
            assert time.monotonic() < end, client.get("/readyz").text
            time.sleep(0.02)
        yield client


@pytest.fixture(scope="module")
def client(tiny_store: Path) -> Iterator[TestClient]:
    with ready_client(tiny_store) as c:
        yield c


def test_export_writes_and_pins_the_figures(tiny_store: Path) -> None:
    mt_folder, clf_folder = tiny_store / "tiny-mt" / "1", tiny_store / "tiny-clf" / "1"
    mt, clf = verify_folder(mt_folder), verify_folder(clf_folder)
    assert mt.figures == {"curves": "curves.png", "positions": "positions.png"}
    assert clf.figures == {"positions": "positions.png"}
    for folder, manifest in ((mt_folder, mt), (clf_folder, clf)):
        for file_name in manifest.figures.values():
            assert (folder / file_name).read_bytes().startswith(PNG)
            assert manifest.files[file_name].sha256 == sha256_file(folder / file_name)


def test_a_figure_must_be_pinned(tiny_store: Path, tmp_path: Path) -> None:
    folder = tmp_path / "tiny-mt" / "1"
    shutil.copytree(tiny_store / "tiny-mt" / "1", folder)
    manifest = json.loads((folder / "manifest.json").read_text())
    del manifest["files"]["curves.png"]
    (folder / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ManifestError, match=r"not pinned in the manifest: \['curves.png'\]"):
        verify_folder(folder)
    manifest["figures"]["curves"] = "../curves.png"
    (folder / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ManifestError, match="invalid manifest"):
        read_manifest(folder)


def test_extra_figures_are_checked_before_the_export(tmp_path: Path) -> None:
    text, clash, upper = tmp_path / "notes.txt", tmp_path / "positions.png", tmp_path / "Curves.png"
    for path in (text, clash, upper):
        path.write_bytes(PNG)
    with pytest.raises(ExportError, match="not a PNG file"):
        figures_lib.check_extra([text])
    with pytest.raises(ExportError, match="not a PNG file"):
        figures_lib.check_extra([tmp_path / "missing.png"])
    with pytest.raises(ExportError, match="already in the version"):
        figures_lib.check_extra([clash])
    with pytest.raises(ExportError, match="lower-case"):
        figures_lib.check_extra([upper])


def test_cli_keeps_the_runs_curves(
    tmp_path: Path, tiny_classifier: Classifier, tiny_tokenizer: Tokenizer, capsys: pytest.CaptureFixture[str]
) -> None:
    ckpt = tmp_path / "ckpt"
    save_checkpoint(tiny_classifier, tiny_classifier.config, tiny_tokenizer, ckpt)
    (ckpt / "curves.png").write_bytes(PNG + b"curves of the run")
    data = tmp_path / "data"
    (data / "sentiment").mkdir(parents=True)
    rows = [{"text": s, "label": LABELS[i % 3]} for i, s in enumerate(sentences(12, seed=5))]
    for split in ("valid", "test"):
        (data / "sentiment" / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (data / "datacard.json").write_text(json.dumps({"sentiment": {"sources": []}}))
    args = [str(ckpt), "--name", "clf", "--store", str(tmp_path / "store"), "--data-dir", str(data)]
    assert exporter.main([*args, "--variants", "fp32", "--threads", "1"]) == 0
    folder = tmp_path / "store" / "clf" / "1"
    m = verify_folder(folder)
    assert m.figures == {"curves": "curves.png", "positions": "positions.png"}
    out = capsys.readouterr().out.splitlines()
    assert len(out) <= 20 and out[0] == f"published {folder}"
    assert f"  fp32_max_abs_diff: {m.metrics['fp32_max_abs_diff']:.3g}" in out
    assert (folder / "curves.png").read_bytes() == PNG + b"curves of the run"


def test_figures_route_serves_the_pinned_png(client: TestClient, tiny_store: Path) -> None:
    r = client.get("/v1/models/tiny-mt/figures/curves")
    assert r.status_code == 200 and r.headers["content-type"] == "image/png"
    assert r.content == (tiny_store / "tiny-mt" / "1" / "curves.png").read_bytes()
    assert r.headers["etag"] == f'"{sha256_file(tiny_store / "tiny-mt" / "1" / "curves.png")}"'
    r = client.get("/v1/models/tiny-clf/figures/positions")
    assert r.status_code == 200 and r.content.startswith(PNG)
    listed = {m["name"]: m.get("figures") for m in client.get("/v1/models").json()["data"]}
    assert listed == {"tiny-clf": ["positions"], "tiny-mt": ["curves", "positions"]}


@pytest.mark.parametrize(
    ("path", "kind"),
    [
        ("/v1/models/tiny-clf/figures/curves", "not_found"),
        ("/v1/models/tiny-mt/figures/..%2Fmanifest.json", "not_found"),
        ("/v1/models/nope/figures/curves", "model_not_found"),
    ],
)
def test_unknown_figure_or_model_is_a_json_404(client: TestClient, path: str, kind: str) -> None:
    r = client.get(path)
    assert r.status_code == 404 and r.json()["type"] == kind, r.text
    assert r.json()["error"]


def test_a_figure_changed_after_loading_is_not_sent(tiny_store: Path, tmp_path: Path) -> None:
    """The bytes served are the ones checked when the version loaded, kept in memory."""
    shutil.copytree(tiny_store / "tiny-clf", tmp_path / "tiny-clf")
    with ready_client(tmp_path) as c:
        loaded = c.get("/v1/models/tiny-clf/figures/positions")
        assert loaded.status_code == 200
        (tmp_path / "tiny-clf" / "1" / "positions.png").write_bytes(PNG + b"something else")
        r = c.get("/v1/models/tiny-clf/figures/positions")
        assert r.status_code == 200 and r.content == loaded.content
        assert b"something else" not in r.content
