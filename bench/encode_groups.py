"""Encoding a batch of sentences in runs of similar length against one padded run.

    python -m bench.encode_groups [--threads 1] [--variant int8] [--rounds 10]

The bundled translator's encoder on consecutive sentences of the test split (as a join brings
them: mixed lengths), batches of 8, 32 and 64: `service.engine.running.encode_sources` with its
default grouping (`length_groups`) and with grouping off (one run, every sentence padded to the
longest), the two alternating within every round in this one process; medians of the rounds.
Both give the same encoder output per sentence (checked here, within 1e-4). Then the whole
translation of each batch (`translate_ids`, greedy and beam 4), grouping on and off alike, with
the same hypotheses checked.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import numpy as np

import service.engine.running as running
from bench.engines import load_engine, newest
from service.engine.decoding import DecodeParams
from service.engine.lengths import length_groups
from service.engine.runtime import LoadOptions
from service.engine.translator import TranslatorEngine
from service.store import scan

ROOT = Path(__file__).resolve().parents[1]
ONE_RUN = 10**9  # a run's fixed cost so high that every sentence shares one run


def timed(engine: TranslatorEngine, seqs: list[list[int]], call_tokens: int) -> tuple[float, list[running.Encoded]]:
    running.ENCODE_CALL_TOKENS = call_tokens
    t0 = time.perf_counter()
    out = running.encode_sources(engine.rt, seqs, engine.pad_id)
    return time.perf_counter() - t0, out


def main() -> int:
    p = argparse.ArgumentParser(prog="python -m bench.encode_groups", description=__doc__.split("\n")[0])
    p.add_argument("--store", type=Path, default=ROOT / "model_store")
    p.add_argument("--data-dir", type=Path, default=ROOT / "data")
    p.add_argument("--name", default="en-de")
    p.add_argument("--variant", default="int8")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--rounds", type=int, default=10)
    args = p.parse_args()
    engine = load_engine(newest(scan(args.store))[args.name], LoadOptions(threads=args.threads, variant=args.variant))
    assert isinstance(engine, TranslatorEngine)
    rows = [json.loads(x) for x in (args.data_dir / "translation" / "test.jsonl").read_text().splitlines()]
    grouped_default = running.ENCODE_CALL_TOKENS
    start = 0
    for batch in (8, 32, 64):
        seqs = engine.encode([r["en"] for r in rows[start : start + batch]])
        start += batch
        times: dict[str, list[float]] = {"one run": [], "grouped": []}
        outs: dict[str, list[running.Encoded]] = {}
        for r in range(args.rounds):
            order = [("one run", ONE_RUN), ("grouped", grouped_default)]
            for name, call in order if r % 2 else order[::-1]:
                seconds, out = timed(engine, seqs, call)
                times[name].append(seconds)
                outs[name] = out
        for a, b in zip(outs["one run"], outs["grouped"], strict=True):
            same = all(np.allclose(x, y, rtol=0, atol=1e-4) for x, y in zip(a.cross, b.cross, strict=True))
            assert a.length == b.length and same, "grouping changed a sentence's encoder output"
        one, grouped = (statistics.median(times[k]) * 1000 for k in ("one run", "grouped"))
        runs = len(length_groups([len(s) for s in seqs], grouped_default))
        lengths = sorted(map(len, seqs))
        print(
            f"batch {batch} (tokens {lengths[0]}..{lengths[-1]}, mean {sum(lengths) / batch:.1f}): one run "
            f"{one:.1f} ms, {runs} runs {grouped:.1f} ms, speed {one / grouped:.2f}x",
            flush=True,
        )
        for beam in (1, 4):
            params = DecodeParams(beam_size=beam)
            spent: dict[int, list[float]] = {ONE_RUN: [], grouped_default: []}
            hyps = {}
            for r in range(max(args.rounds // 2, 3)):
                for call in (ONE_RUN, grouped_default) if r % 2 else (grouped_default, ONE_RUN):
                    running.ENCODE_CALL_TOKENS = call
                    t0 = time.perf_counter()
                    hyps[call] = engine.translate_ids(seqs, params)
                    spent[call].append(time.perf_counter() - t0)
            assert hyps[ONE_RUN] == hyps[grouped_default], "grouping changed a translation"
            a, b = (statistics.median(spent[c]) for c in (ONE_RUN, grouped_default))
            print(f"  translate beam {beam}: {a * 1000:.0f} ms -> {b * 1000:.0f} ms, speed {a / b:.2f}x", flush=True)
    running.ENCODE_CALL_TOKENS = grouped_default
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
