"""One answer per input: the bundled translator decodes each test sentence exactly as alone when
it shares steps with others, all at once or joining a running batch at every step.

    python -m bench.invariance                  # 300 test sentences, greedy, beam 4 and as served
    python -m bench.invariance --sentences 1000 --variant fp32

For each decode mode (greedy, beam 4, and the model's own defaults): every sentence alone; all
of them in one batch; and staggered, a few joining the running batch at every step (the
service's step scheduler does the same), on a batch sharded over the engine's threads when it
has more than one. Tokens must be identical, and scores within 1e-4 in fp32 (int8 and fp16
scores may drift by up to about 1e-3, see main); the report counts the sentences that differ in
tokens, and in tokens or scores, and the largest drift. Writes bench/results/invariance.json.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
from collections.abc import Sequence
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path

from bench.engines import load_engine, newest
from service.engine.decoding import DecodeParams, Hypothesis
from service.engine.runtime import LoadOptions
from service.engine.translator import TranslatorEngine
from service.errors import InputTooLong
from service.store import scan

ROOT = Path(__file__).resolve().parents[1]
SCORE_TOL = 1e-4


def staggered(engine: TranslatorEngine, seqs: Sequence[Sequence[int]], params: DecodeParams, per_step: int) -> list:
    """`per_step` sentences join the running batch before every step, as arrivals would."""
    out: list[list[Hypothesis]] = [[] for _ in seqs]
    batch = engine.new_batch()  # type: ignore[var-annotated]
    pending = list(range(len(seqs)))
    while pending or batch.blocks:
        joining, pending = pending[:per_step], pending[per_step:]
        batch.join([seqs[i] for i in joining], [engine.search(params) for _ in joining], joining)
        for i, hyps in batch.step():
            out[i] = hyps
    return out


def differs(a: Sequence[Hypothesis], b: Sequence[Hypothesis], scores: bool = True) -> bool:
    """Other tokens, or (with `scores`) a score further than SCORE_TOL."""
    return len(a) != len(b) or any(
        x.tokens != y.tokens or (scores and abs(x.score - y.score) > SCORE_TOL) for x, y in zip(a, b, strict=True)
    )


def measure(engine: TranslatorEngine, seqs: list[list[int]], params: DecodeParams) -> dict[str, object]:
    """Counts sentences whose tokens differ from alone, and those whose tokens or scores do."""
    t0 = time.perf_counter()
    alone = [engine.translate_ids([s], params)[0] for s in seqs]
    report: dict[str, object] = {"sentences": len(seqs)}
    for name, other in (
        ("together", engine.translate_ids(seqs, params)),
        ("staggered", staggered(engine, seqs, params, per_step=3)),
    ):
        pairs = list(zip(alone, other, strict=True))
        report[f"tokens_differ_{name}"] = sum(differs(a, b, scores=False) for a, b in pairs)
        report[f"differ_{name}"] = sum(differs(a, b) for a, b in pairs)
        same = [(x, y) for a, b in pairs for x, y in zip(a, b, strict=False) if x.tokens == y.tokens]
        drift = [abs(x.score - y.score) for x, y in same]
        report[f"max_score_drift_{name}"] = float(f"{max(drift, default=0.0):.2e}")
    report["seconds"] = round(time.perf_counter() - t0, 1)
    return report


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.invariance", description=__doc__.split("\n")[0])
    p.add_argument("--store", type=Path, default=ROOT / "model_store")
    p.add_argument("--data-dir", type=Path, default=ROOT / "data")
    p.add_argument("--sentences", type=int, default=300)
    p.add_argument("--variant", default=None, help="default: the manifest's default variant")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "invariance.json")
    args = p.parse_args(argv)
    entries = [e for e in newest(scan(args.store)).values() if e.manifest and e.manifest.task == "translation"]
    if not entries:
        print(f"no translator in {args.store}", file=sys.stderr)
        return 1
    engine = load_engine(entries[0], LoadOptions(threads=args.threads, variant=args.variant))
    assert isinstance(engine, TranslatorEngine)
    rows = [json.loads(line) for line in (args.data_dir / "translation" / "test.jsonl").read_text().splitlines()]
    seqs: list[list[int]] = []  # sentences as the service splits them (a text too long is skipped)
    for row in rows:
        with contextlib.suppress(InputTooLong):
            seqs += engine.prepare([row["en"]]).sources
        if len(seqs) >= args.sentences:
            break
    seqs = seqs[: args.sentences]
    report: dict[str, object] = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "model": f"{entries[0].name}/{entries[0].version}",
        "variant": engine.variant,
        "threads": args.threads,
        "score_tolerance": SCORE_TOL,
    }
    limit = engine.max_new_tokens
    for name, params in (
        ("greedy", DecodeParams(beam_size=1, max_new_tokens=limit)),
        ("beam 4", DecodeParams(beam_size=4, max_new_tokens=limit)),
        ("as served", replace(engine.default_params(), max_new_tokens=limit)),  # the manifest's generation
    ):
        report[name] = measure(engine, seqs, params)
        print(name, report[name], flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    # Tokens must never differ. Scores must stay within SCORE_TOL in fp32. Where a sum's order
    # depends on the batch its last bit moves, and int8 (activations on a grid) or fp16 (11 bits)
    # can make that a whole step: reported for those variants (the bundled int8 model's steps are
    # bit-identical alone and batched; docs/results.md), failing only on tokens.
    keys = ("tokens_differ_together", "tokens_differ_staggered")
    if engine.variant == "fp32":
        keys += ("differ_together", "differ_staggered")
    bad = any(r[k] for r in (report["greedy"], report["beam 4"]) for k in keys)  # type: ignore[index]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
