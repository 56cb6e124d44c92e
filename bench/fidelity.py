"""Text fidelity of a served translator (`python -m bench.fidelity`): what the user wrote comes back.

On bench/data/fidelity.jsonl (strings of the test split that carry protected spans, and
hand-written ones with placeholders, URLs, e-mail addresses, paths, options, numbers, markup
and several lines) or, with `--set`, bench/data/fidelity_kinds.jsonl (software, UI and
operations text written for this bench: keys, digests, commit ids, UUIDs, versions, addresses
and ports, quoted commands, among the other kinds), translated as the service translates (lines
and sentences split, spans masked, beam 4 unless `--beam` says otherwise):
- spans verbatim: each protected span of the input occurs in the output as often as in the input,
  in all and per kind (the rule that found it, `service.contract.spans`);
- spans placed by the model: the model itself put the span's placeholder into its sentence
  (the search lets no sentence end without them, `decoding.Placeholders`; one cut at its length
  limit first has the rest appended at the end of its translation: never lost, but placed by the
  rule, not by the model);
- lines kept: the output has the input's line breaks, in order, and its blank lines.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from dataclasses import replace
from pathlib import Path

from bench.engines import newest
from service.contract import spans
from service.engine import text
from service.engine.decoding import DecodeParams
from service.engine.runtime import LoadOptions
from service.engine.translator import load_translator
from service.store import scan

ROOT = Path(__file__).resolve().parents[1]
PLACEHOLDER = re.compile(r"⟨(\d+)⟩")


def line_shape(s: str) -> list[str]:
    """The line breaks and which lines are blank: what a translation must keep."""
    parts = text.LINE_BREAK.split(s)
    breaks = text.LINE_BREAK.findall(s)
    return breaks + ["blank" if not p.strip() else "text" for p in parts]


def evaluate(
    store: Path,
    name: str,
    variant: str | None,
    rows: list[dict[str, str]],
    beam: int = 4,
    guarantee: bool = True,
    threads: int = 0,
) -> dict[str, object]:
    """`guarantee` False: searches without their placeholders (`decoding.Placeholders`), as before them."""
    engine = load_translator(newest(scan(store))[name], LoadOptions(threads=threads, variant=variant))
    params = DecodeParams(beam_size=beam, max_new_tokens=engine.max_new_tokens)
    texts = [r["text"] for r in rows]
    prepared = engine.prepare(texts)
    if not guarantee:
        prepared = replace(prepared, placeholders=())
    hyps = engine.run(prepared.sources, engine.searches(prepared, params))  # each with its placeholders, as served
    outputs = [row[0].text for row in engine.assemble(prepared, hyps, params.length_penalty)]
    total = verbatim = lines_kept = 0
    failures = []
    kinds: dict[str, list[int]] = {}  # kind -> [kept, total]
    for out, src in zip(outputs, texts, strict=True):
        found = spans.find_spans(src, True, engine.codec.alphabet, verbatim=True, words=engine.codec.words)  # as served
        originals = [src[s.start : s.end] for s in found]
        total += len(originals)
        kept = [out.count(x) >= src.count(x) for x in originals]
        verbatim += sum(kept)
        for span, k in zip(found, kept, strict=True):
            kinds.setdefault(span.kind, [0, 0])[0] += k
            kinds[span.kind][1] += 1
        shape_kept = line_shape(out) == line_shape(src)
        lines_kept += shape_kept
        if not shape_kept or not all(kept):
            failures.append({"text": src, "translation": out})
    segments = [seg for layout in prepared.layouts for seg in layout.segments]  # in the order of `hyps`
    placed = 0
    for seg, row in zip(segments, hyps, strict=True):
        used = {int(m) for m in PLACEHOLDER.findall(engine.codec.decode(row[0].tokens))}
        placed += sum(1 for n in range(1, len(seg.spans) + 1) if n in used)
    masked_total = sum(len(seg.spans) for seg in segments)
    return {
        "texts": len(rows),
        "spans": total,
        "spans_verbatim": verbatim / total if total else 1.0,
        "spans_by_kind": {k: {"kept": n[0], "of": n[1]} for k, n in sorted(kinds.items())},
        "spans_masked": masked_total,
        "spans_placed_by_model": placed / masked_total if masked_total else 1.0,
        "multi_line_texts": sum(len(line_shape(t)) > 1 for t in texts),
        "lines_kept": lines_kept / len(rows),
        "failures": failures[:20],
        "examples": [{"text": t, "translation": o} for t, o in list(zip(texts, outputs, strict=True))[-12:]],
    }


def main() -> int:
    p = argparse.ArgumentParser(prog="python -m bench.fidelity", description=__doc__.split("\n")[0])
    p.add_argument("--store", type=Path, default=ROOT / "model_store")
    p.add_argument("--model", default="en-de")
    p.add_argument("--variant", default=None)
    p.add_argument("--set", type=Path, default=ROOT / "bench" / "data" / "fidelity.jsonl")
    p.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "fidelity.json")
    p.add_argument("--beam", type=int, default=4, help="beam size (1: greedy)")
    p.add_argument("--threads", type=int, default=0, help="ONNX Runtime threads (0: the CPU quota)")
    p.add_argument(
        "--without-guarantee", action="store_true", help="searches without their placeholders, for comparison"
    )
    args = p.parse_args()
    rows = [json.loads(line) for line in args.set.read_text(encoding="utf-8").splitlines() if line.strip()]
    result = evaluate(args.store, args.model, args.variant, rows, args.beam, not args.without_guarantee, args.threads)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2, ensure_ascii=False) + "\n")
    print(
        f"{result['texts']} texts, {result['spans']} spans: {result['spans_verbatim']:.1%} verbatim, "
        f"{result['spans_placed_by_model']:.1%} placed by the model; "
        f"lines kept in {result['lines_kept']:.1%} ({result['multi_line_texts']} multi-line texts)"
    )
    by_kind = result["spans_by_kind"]
    assert isinstance(by_kind, dict)
    print("verbatim by kind: " + ", ".join(f"{k} {n['kept']}/{n['of']}" for k, n in by_kind.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
