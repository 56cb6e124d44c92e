"""What the attention outputs cost when nobody asks for them: the served graphs against the same
graphs with the attention outputs removed (ONNX Runtime then drops the nodes that only fed them).

    python -m bench.attention_cost                   # the bundled store, 1 thread
    python -m bench.attention_cost --store STORE --threads 2

ONNX Runtime computes every output of a graph whatever a call asks for, so the question is the
price of `cross_attentions` (decoder) and `attentions` (classifier) in every call. Both graphs
of a pair run on the same inputs, alternating, in this one process; the median of rounds is
reported as a ratio (served ÷ without). Writes bench/results/attention_cost.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path

import numpy as np
import onnx

from bench.engines import newest
from service.contract import graphs
from service.engine.runtime import make_session
from service.store import read_pinned, scan

ROOT = Path(__file__).resolve().parents[1]


def without_output(model: bytes, name: str) -> bytes:
    proto = onnx.load_from_string(model)
    keep = [o for o in proto.graph.output if o.name != name]
    del proto.graph.output[:]
    proto.graph.output.extend(keep)
    return proto.SerializeToString()


def timed(fn: Callable[[], object], runs: int) -> float:
    fn()
    t0 = time.perf_counter()
    for _ in range(runs):
        fn()
    return (time.perf_counter() - t0) / runs


def compare(a: Callable[[], object], b: Callable[[], object], rounds: int, runs: int) -> dict[str, float]:
    ta, tb = [], []
    for _ in range(rounds):
        ta.append(timed(a, runs))
        tb.append(timed(b, runs))
    served, bare = statistics.median(ta), statistics.median(tb)
    return {"served_ms": served * 1000, "without_ms": bare * 1000, "ratio": served / bare}


def decoder_feeds(manifest_arch: dict, rows: int, slots: int, source: int) -> dict[str, np.ndarray]:
    n, h = int(manifest_arch["n_dec_layers"]), int(manifest_arch["n_heads"])
    dk = int(manifest_arch["d_model"]) // h
    rng = np.random.default_rng(0)
    kv = rng.normal(size=(rows, h, slots, dk)).astype(np.float32)
    cross = rng.normal(size=(rows, h, source, dk)).astype(np.float32)
    return {
        graphs.INPUT_IDS: rng.integers(5, 100, (rows, 1)),
        graphs.POSITION_IDS: np.full(rows, slots - 1, np.int64),
        graphs.ENCODER_ATTENTION_MASK: np.ones((rows, source), np.int64),
        **dict(zip((graphs.FOLD, graphs.UNFOLD), graphs.per_row_folding(rows), strict=True)),
        **{name: kv for name in graphs.cache_names(n)},
        **{name: cross for name in graphs.cross_names(n)},
    }


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.attention_cost", description=__doc__.split("\n")[0])
    p.add_argument("--store", type=Path, default=ROOT / "model_store")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "attention_cost.json")
    args = p.parse_args(argv)
    report: dict[str, object] = {"threads": args.threads, "rounds": args.rounds}
    for entry in newest(scan(args.store)).values():
        m = entry.require_manifest()
        files = m.variant_files(m.default_variant)
        if m.task == "translation":
            model, output = read_pinned(entry, files["decoder"]), graphs.CROSS_ATTENTIONS
        else:
            model, output = read_pinned(entry, files["model"]), graphs.ATTENTIONS
        served = make_session(model, ["CPUExecutionProvider"], args.threads)
        bare = make_session(without_output(model, output), ["CPUExecutionProvider"], args.threads)
        names = [o.name for o in bare.get_outputs()]
        for batch in (1, 32):
            if m.task == "translation":
                feeds = decoder_feeds(m.architecture, batch * 4, 24, 24)  # a beam-4 step at position 23
                what = f"decoder step, {batch * 4} rows"
            else:
                ids = np.random.default_rng(0).integers(5, 100, (batch, 32))
                feeds = {graphs.INPUT_IDS: ids, graphs.ATTENTION_MASK: np.ones_like(ids)}
                what = f"classifier, batch {batch}"
            runs = 200 if batch == 1 else 20
            r = compare(partial(served.run, names, feeds), partial(bare.run, names, feeds), args.rounds, runs)
            report[f"{entry.name} {m.default_variant}: {what}"] = r
            print(f"{entry.name} {m.default_variant} {what}: served ÷ without attention outputs {r['ratio']:.3f}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
