"""Quality of the served models on the test splits, through the engines as the service runs them.

Translator (beam 4, lines and sentences split, spans masked): sacreBLEU BLEU and chrF, and the
share of outputs with an immediate repetition the reference lacks (a word twice in a row, or a
word pair twice in a row: "Änderungen speichern speichern?"). Classifier: accuracy and macro-F1
overall and per source, and the VADER lexicon on the same split for scale.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path

from bench.engines import load_engine, newest
from service.engine.classifier import ClassifierEngine
from service.engine.decoding import DecodeParams
from service.engine.runtime import LoadOptions
from service.engine.translator import TranslatorEngine
from service.store import scan

ROOT = Path(__file__).resolve().parents[1]


def repetitions(text: str) -> Counter[tuple[str, ...]]:
    """Immediate repetitions: a word twice in a row, or a word pair twice in a row."""
    w = text.lower().split()
    out: Counter[tuple[str, ...]] = Counter()
    out.update((w[i],) for i in range(len(w) - 1) if w[i] == w[i + 1] and any(c.isalpha() for c in w[i]))
    out.update(tuple(w[i : i + 2]) for i in range(len(w) - 3) if w[i : i + 2] == w[i + 2 : i + 4])
    return out


def repeats_beyond_reference(hyp: str, ref: str) -> bool:
    ref_reps = repetitions(ref)
    return any(n > ref_reps[gram] for gram, n in repetitions(hyp).items())


def translate_rows(engine: TranslatorEngine, sources: list[str], batch: int = 64) -> list[str]:
    """Beam-4 translations as served (lines and sentences split, spans masked), in input order;
    batches of similar length, as a server's would be."""
    params = DecodeParams(beam_size=4, max_new_tokens=engine.max_new_tokens)
    order = sorted(range(len(sources)), key=lambda i: len(sources[i]))
    hyps = [""] * len(sources)
    for s in range(0, len(order), batch):
        idx = order[s : s + batch]
        for i, row in zip(idx, engine.translate([sources[i] for i in idx], params), strict=True):
            hyps[i] = row[0].text
    return hyps


def translation_scores(hyps: list[str], refs: list[str]) -> dict[str, float | int]:
    """sacreBLEU corpus BLEU and chrF, and the share of outputs repeating beyond the reference."""
    import sacrebleu

    rep = sum(repeats_beyond_reference(h, r) for h, r in zip(hyps, refs, strict=True))
    return {
        "sentences": len(refs),
        "bleu": round(sacrebleu.corpus_bleu(hyps, [refs]).score, 2),
        "chrf": round(sacrebleu.corpus_chrf(hyps, [refs]).score, 2),
        "repeated_ngram_share": rep / len(refs) if refs else 0.0,
    }


def translator_quality(engine: TranslatorEngine, rows: list[dict[str, str]]) -> dict[str, object]:
    hyps = translate_rows(engine, [r["en"] for r in rows])
    refs = [r["de"] for r in rows]
    rep = [repeats_beyond_reference(h, r) for h, r in zip(hyps, refs, strict=True)]
    return {
        **translation_scores(hyps, refs),
        "repeated_examples": [{"hyp": h, "ref": r} for h, r, x in zip(hyps, refs, rep, strict=True) if x][:10],
        "examples": [{"en": r["en"], "ref": r["de"], "hyp": h} for r, h in list(zip(rows, hyps, strict=True))[:10]],
    }


def classifier_quality(engine: ClassifierEngine, rows: list[dict[str, str]]) -> dict[str, object]:
    from export.metrics import classification_report  # the training's own report, for one definition

    labels = engine.labels
    probs = [
        engine.classify_ids(engine.encode([r["text"] for r in rows[s : s + 256]])) for s in range(0, len(rows), 256)
    ]
    pred = [int(p.argmax()) for chunk in probs for p in chunk]
    gold = [labels.index(r["label"]) for r in rows]
    return classification_report(gold, pred, [r["source"] for r in rows], len(labels))


def main() -> int:
    p = argparse.ArgumentParser(prog="python -m bench.quality", description=__doc__.split("\n")[0])
    p.add_argument("--store", type=Path, default=ROOT / "model_store")
    p.add_argument("--data-dir", type=Path, default=ROOT / "data")
    p.add_argument("--variants", default="", help="comma list (default: each model's shipped variants)")
    p.add_argument("--threads", type=int, default=0)
    p.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "quality.json")
    args = p.parse_args()
    results: dict[str, object] = {}
    for name, entry in sorted(newest(scan(args.store)).items()):
        manifest = entry.require_manifest()
        variants = args.variants.split(",") if args.variants else sorted(manifest.variants)
        for variant in variants:
            engine = load_engine(entry, LoadOptions(threads=args.threads, variant=variant))
            if isinstance(engine, TranslatorEngine):
                rows = [json.loads(x) for x in (args.data_dir / "translation" / "test.jsonl").read_text().splitlines()]
                result = translator_quality(engine, rows)
                print(
                    f"{name} {variant}: BLEU {result['bleu']} chrF {result['chrf']}, "
                    f"repetitions {result['repeated_ngram_share']:.2%}",
                    flush=True,
                )
            else:
                assert isinstance(engine, ClassifierEngine)
                rows = [json.loads(x) for x in (args.data_dir / "sentiment" / "test.jsonl").read_text().splitlines()]
                result = classifier_quality(engine, rows)
                print(f"{name} {variant}: accuracy {result['all']['accuracy']:.4f}", flush=True)  # type: ignore[index]
            results[f"{name}/{entry.version}/{variant}"] = result
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2, ensure_ascii=False) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
