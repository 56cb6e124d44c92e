"""Schemathesis, every check and every phase, against a real server: what the API document says
a request may be and what the server answers agree (bench/schemathesis.toml says which statuses
beyond schemathesis' defaults the API really answers, and why).

Twice: with the default settings (model control closed: the repository routes answer 403), and
with keys, where the admin key opens model control and the stateful phase loads and unloads the
models while the other operations run (an unloaded model's 503 is a documented answer). The run
is bounded for CI; `make fuzz` (docs/protocols.md, "The API document") is the long one.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from bench.serverproc import ROOT
from tests.helpers import run_server

pytestmark = pytest.mark.fuzz  # fuzzing: left out of `make test-fast`

SCHEMATHESIS = Path(sys.executable).with_name("schemathesis")
CONFIG = ROOT / "bench" / "schemathesis.toml"
MAX_TIME_S = 45  # the whole run; fuzzing and stateful phases repeat until it is spent
SHORT = ["--checks", "all", "--phases", "examples,coverage,fuzzing,stateful", "--max-time", str(MAX_TIME_S)]
SHORT += ["-n", "5", "--workers", "1", "--seed", "1", "--no-shrink"]
INFER, ADMIN = "infer-key-0123456789", "admin-key-0123456789"
KEYED = {"api_keys": f"web:{INFER}", "admin_keys": f"ops:{ADMIN}", "metrics_keys": "prom:metrics-key-0123"}


@pytest.mark.slow
@pytest.mark.parametrize("keys", [False, True], ids=["default", "keys"])
def test_schemathesis_finds_no_disagreement(tiny_store: Path, tmp_path: Path, keys: bool) -> None:
    settings = KEYED if keys else {}
    auth = ["-H", f"Authorization: Bearer {ADMIN}"] if keys else []
    with run_server(tiny_store, tmp_path / "server.log", **settings) as server:
        cmd = [str(SCHEMATHESIS), "--config-file", str(CONFIG), "run", f"{server.url}/openapi.json", *SHORT, *auth]
        t0 = time.monotonic()
        # in tmp_path: schemathesis and hypothesis leave their databases in the working directory
        done = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=MAX_TIME_S + 120)
        took = time.monotonic() - t0
    out = done.stdout + done.stderr
    print(f"schemathesis took {took:.0f} s", out[-4000:], sep="\n")
    assert done.returncode == 0, out
    assert " passed" in out and "Stateful" in out, out  # it ran, the stateful phase too
