"""The engines alone, for `bench.service_load`: what the server's CPUs can do without HTTP.

Run pinned to the server's CPUs; prints one JSON line: /predict texts/s at batch 32 and one
text's classify time (tokenize + graph), /translate beam-4 texts/s at batch 32. `--parts`
picks them; `predict-graph` adds the classifier without its tokenizer at batch 32 (texts
tokenized once, outside the timing), the other denominator `bench.peer` reports.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path

from bench.engines import load_engine, newest
from bench.service_load import REVIEWS, SHORT
from service.engine.classifier import ClassifierEngine
from service.engine.decoding import DecodeParams
from service.engine.runtime import LoadOptions
from service.engine.translator import TranslatorEngine
from service.store import scan


def rate(fn: Callable[[], int], seconds: float) -> tuple[float, float]:
    """Items per second of wall time and per second of this process's CPU time (the second is
    less swayed by a hypervisor that takes the core away now and then)."""
    fn()
    n, t0, c0 = 0, time.perf_counter(), time.process_time()
    while time.perf_counter() - t0 < seconds:
        n += fn()
    return n / (time.perf_counter() - t0), n / max(1e-9, time.process_time() - c0)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--store", type=Path, required=True)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--seconds", type=float, default=10.0)
    p.add_argument("--parts", default="predict,translate", help="predict, predict-graph, translate")
    args = p.parse_args()
    parts = args.parts.split(",")
    options = LoadOptions(threads=args.threads)
    engines = {
        e.require_manifest().task: load_engine(e, options) for e in newest(scan(args.store)).values() if e.manifest
    }
    clf, mt = engines.get("classification"), engines.get("translation")
    out: dict[str, float] = {}
    if isinstance(clf, ClassifierEngine) and "predict-graph" in parts:
        ids = clf.encode((REVIEWS * 4)[:32])
        out["predict_graph_texts_per_s"] = rate(lambda: len(clf.classify_ids(ids)), args.seconds)[0]
    if isinstance(clf, ClassifierEngine) and "predict" in parts:
        batch = (REVIEWS * 4)[:32]
        per_s, per_cpu_s = rate(lambda: len(clf.classify_ids(clf.encode(batch))), args.seconds)
        out["predict_texts_per_s"], out["predict_texts_per_cpu_s"] = per_s, per_cpu_s
        times = []
        for _ in range(200):
            t0 = time.perf_counter()
            clf.classify_ids(clf.encode(REVIEWS[:1]))
            times.append(time.perf_counter() - t0)
        out["predict_single_ms"] = 1000 * statistics.median(times)
    if isinstance(mt, TranslatorEngine) and "translate" in parts:
        batch = (SHORT * 4)[:32]
        params = DecodeParams(beam_size=4, max_new_tokens=mt.max_new_tokens)
        per_s, per_cpu_s = rate(lambda: len(mt.translate(batch, params)), args.seconds)
        out["translate_beam4_texts_per_s"], out["translate_beam4_texts_per_cpu_s"] = per_s, per_cpu_s
    print(json.dumps(out))


if __name__ == "__main__":
    main()
