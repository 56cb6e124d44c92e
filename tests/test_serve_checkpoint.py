"""`transformer-serve serve CHECKPOINT_FOLDER`: a tiny random Marian built here is imported once into the
import cache and served; /translate answers as transformers' `generate`; a second start imports
nothing; a changed folder is imported again."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import torch
import transformers

from bench.serverproc import ServerProcess, free_port, stop, wait_ready
from tests.hf_checkpoints import FAMILY_CASES, Checkpoint, build

pytestmark = pytest.mark.families  # a Hugging Face checkpoint against transformers: left out of `make test-fast`

ROOT = Path(__file__).resolve().parents[1]
TEXTS = ["the cat sat on the mat", "привет мир", "a b c d e f g h", "数字 123 and 456"]


@contextlib.contextmanager
def serving(folder: Path, cache: Path, log: Path, *flags: str) -> Iterator[tuple[ServerProcess, float]]:
    """`python -m service.cli serve FOLDER` (the console script's code) until ready; the seconds that took."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("SERVE_")}
    cmd = [sys.executable, "-m", "service.cli", "serve", str(folder), "--port", str(port), "--import-cache", str(cache)]
    cmd += ["--threads", "1", "--model-thread-priority", "nice", *flags]
    t0 = time.perf_counter()
    with log.open("ab") as out:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=out, stderr=out)
    server = ServerProcess(f"http://127.0.0.1:{port}", port, proc, log)
    try:
        wait_ready(server, 300)
        yield server, time.perf_counter() - t0
    finally:
        stop(server, 15)


def reference(folder: Path, texts: list[str], **options: object) -> list[str]:
    """transformers itself: each text alone through `generate` (the folder's generation config)."""
    tok = transformers.AutoTokenizer.from_pretrained(folder, local_files_only=True)
    model = transformers.AutoModelForSeq2SeqLM.from_pretrained(folder, local_files_only=True).eval()
    out = []
    with torch.no_grad():
        for text in texts:
            ids = model.generate(**tok(text, return_tensors="pt"), **options)
            out.append(tok.decode(ids[0], skip_special_tokens=True))
    return out


def translate(server: ServerProcess, **body: object) -> list[str]:
    r = httpx.post(server.url + "/translate", json={"texts": TEXTS, **body}, timeout=60)
    assert r.status_code == 200, r.text
    return [t["text"] for t in r.json()["translations"]]


def test_a_checkpoint_folder_is_imported_once_and_served_as_transformers_answers(
    marian: Checkpoint, tmp_path: Path
) -> None:
    generation = dict(FAMILY_CASES["marian"][1]) | {"bad_words_ids": [[marian.config.pad_token_id]]}
    folder = build(marian, tmp_path / "Opus-MT tiny", generation)
    cache, log = tmp_path / "cache", tmp_path / "server.log"
    beams, greedy = reference(folder, TEXTS), reference(folder, TEXTS, num_beams=1)
    assert beams != greedy or len(set(beams)) > 1  # real decoding: the two searches are compared apart

    with serving(folder, cache, log, "--languages", "en,de") as (server, first):
        assert translate(server) == beams  # the checkpoint's own decoding defaults: beam 4
        assert translate(server, beam_size=1) == greedy
        models = httpx.get(server.url + "/v1/models", timeout=10).json()
    [imported] = [p for p in cache.iterdir()]
    assert [m.name for m in imported.iterdir()] == ["opus-mt-tiny"]  # the folder's name, as a store name
    assert "opus-mt-tiny" in str(models)
    stamp = {p: p.stat().st_mtime_ns for p in imported.rglob("*")}

    with serving(folder, cache, log, "--languages", "en,de") as (server, second):
        assert translate(server) == beams
    assert [p for p in cache.iterdir()] == [imported]  # nothing imported again, nothing rewritten
    assert {p: p.stat().st_mtime_ns for p in imported.rglob("*")} == stamp
    reused = [line for line in log.read_text().splitlines() if "nothing imported" in line]
    assert len(reused) == 1, log.read_text()[-2000:]

    (folder / "README.md").write_text("a model card\n")  # a changed folder: imported again
    with serving(folder, cache, log, "--languages", "en,de") as (server, third):
        assert translate(server, beam_size=1) == greedy
    assert len(list(cache.iterdir())) == 2 and not [p for p in cache.iterdir() if p.name.startswith(".")]
    print(f"ready after: first start (import) {first:.1f} s, second (cached) {second:.1f} s, changed {third:.1f} s")
    assert second < first


def test_a_checkpoint_the_importer_refuses_is_one_line_exit_2_and_leaves_nothing(tmp_path: Path) -> None:
    folder, cache = tmp_path / "ckpt", tmp_path / "cache"
    folder.mkdir()
    (folder / "config.json").write_text('{"model_type": "marian"}')
    env = {k: v for k, v in os.environ.items() if not k.startswith("SERVE_")}
    cmd = [sys.executable, "-m", "service.cli", "serve", str(folder), "--import-cache", str(cache), "--port", "0"]
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    last = done.stderr.strip().splitlines()[-1]
    assert (
        last == f"transformer-serve serve: import of {folder} failed: {folder}: missing weights (no *.safetensors file)"
    )
    assert list(cache.iterdir()) == []  # no store, no staging folder
