"""Quality of the served models on the test splits, through the engines as the service runs them.

Translator (the model's decoding defaults, beam 4, unless `--length-penalty` or
`--early-stopping` say otherwise; lines and sentences split, spans masked): sacreBLEU BLEU and
chrF, the share of outputs with an immediate repetition the reference lacks (a word twice in a
row, or a word pair twice in a row: "Änderungen speichern speichern?"), dropped content (the
share of outputs shorter than 60 % of the reference in characters, and the share with fewer
content words than greedy search gives: `dropped_scores`), and retention: of the identifiers,
inline code, names, quoted spans and dash runs (`service.contract.verbatim`, as the service finds
them) that the reference keeps as written, the share the translation keeps as written too (and,
apart, the same for the capitalised words the service leaves to the model, and per kind for every span
the service masks); on the test split and, with
`--ood`, on the out-of-domain stand-in of `bench.ood` (and apart on its messages the training
split lacks: a message of a stand-in package can also be another package's). Classifier: accuracy and macro-F1 overall
and per source, the expected calibration error, and the VADER lexicon on the same split for
scale; and the same on `bench/data/short_texts.jsonl`, everyday texts of one to eight words
written for this bench (60 per class), with how many of them occur in the training split.
"""

from __future__ import annotations

import argparse
import functools
import json
import re
import sys
from collections import Counter
from dataclasses import replace
from pathlib import Path
from typing import Any

from bench.engines import load_engine, newest
from service.contract import spans, verbatim
from service.engine.classifier import ClassifierEngine
from service.engine.decoding import DecodeParams
from service.engine.runtime import LoadOptions
from service.engine.translator import TranslatorEngine
from service.errors import InputTooLong
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


# Function words a translation may lose without losing what the user wrote: articles, pronouns,
# prepositions, conjunctions, auxiliaries. Negations ("nicht", "kein") are content: dropping one
# turns the meaning round.
STOP_WORDS = frozenset(
    """
    der die das den dem des ein eine einen einem einer eines und oder aber doch denn sondern dass
    ob wenn als wie so zu zum zur im in ins am an auf aus bei mit nach von vom vor für über unter
    um durch gegen ohne bis seit ab es er sie ich du wir ihr sich mich dich uns euch mir dir ihm
    ihn ihnen man dies diese dieser dieses diesen diesem sein seine ihre ihren ihrem ist sind war
    waren bin bist seid wird werden wurde wurden kann können konnte muss müssen soll sollen hat
    haben hatte hatten habe wollen will möchten auch nur noch schon hier da dann jetzt sehr
    """.split()
)
# Quotes and brackets before a word, those and sentence punctuation after it (a "%s" or "--all" keeps its sign).
_EDGES = re.compile(r"^[\"'„“”‚‘’«»(\[{¿¡]+|[\"'„“”‚‘’«»)\]}.,:;!?…]+$")
SHORT_RATIO = 0.6  # below this output/reference length, a translation has likely lost content


def content_words(text: str) -> frozenset[str]:
    """The distinct content words of a German text, case-folded: tokens between spaces, quotes,
    brackets and punctuation stripped from their ends (`_EDGES`), made of letters (and inner
    hyphens: "Datei-Manager"), outside `STOP_WORDS`. Distinct, so a repeated word counts once: a
    repetition is not content."""
    words = (_EDGES.sub("", w).casefold() for w in text.split())
    return frozenset(w for w in words if w.replace("-", "").isalpha() and w not in STOP_WORDS)


def length_ratio(hyp: str, ref: str) -> float:
    """Output over reference length in characters, spaces left out (1.0 for an empty reference).
    Characters, not words: German compounds ("Wetterbericht", "Bericht über das Wetter") move a
    word count more than the content, and a short message (most of the stand-in's) has too few
    words for a ratio to be finer than halves."""
    n = len("".join(ref.split()))
    return len("".join(hyp.split())) / n if n else 1.0


def dropped_scores(hyps: list[str], refs: list[str], greedy: list[str]) -> dict[str, float]:
    """Dropped content: the share of translations shorter than `SHORT_RATIO` of their reference
    (`length_ratio`), and the share with fewer content words (`content_words`) than the greedy
    translation of the same source; with, for scale, the share with more (a paraphrase moves
    the count either way: what beam search drops is the difference)."""
    n = len(refs) or 1
    short = sum(length_ratio(h, r) < SHORT_RATIO for h, r in zip(hyps, refs, strict=True))
    counts = [(len(content_words(h)), len(content_words(g))) for h, g in zip(hyps, greedy, strict=True)]
    return {
        "short_share": short / n,
        "fewer_content_than_greedy": sum(h < g for h, g in counts) / n,
        "more_content_than_greedy": sum(h > g for h, g in counts) / n,
    }


def translate_rows(
    engine: TranslatorEngine, sources: list[str], batch: int = 64, params: DecodeParams | None = None
) -> list[str]:
    """Translations as served (the model's own decoding defaults unless `params` says otherwise;
    lines and sentences split, spans masked), in input order; batches of similar length, as a
    server's would be."""
    params = params or engine.default_params()
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


RETAINED = {"caps": "identifiers", "snake": "identifiers", "code": "code", "name": "names"}
RETAINED |= {"quotes": "quotes and dashes", "dashes": "quotes and dashes"}


UNMASKED_WORDS = "words the model translates"


def retention(
    sources: list[str],
    refs: list[str],
    hyps: list[str],
    words: frozenset[str],
    vocab_words: frozenset[str] | None = None,
) -> dict[str, object]:
    """Per group of `RETAINED`: the candidates each reference keeps as written, and how many of
    them the translation keeps as written (as often as the source has them). With `vocab_words`
    (the tokenizer's whole words alone), also `UNMASKED_WORDS`: the capitalised words the
    vocabulary lacks but the training text writes in lower case, which the service leaves to the
    model ("Tasks", "Tablet"; a reference may keep one in English). And `kinds`: the same per kind
    for every span the service masks (`spans.find_spans` as served: format strings, keys, digests,
    quoted commands, ... and the candidates)."""
    total: Counter[str] = Counter()
    kept: Counter[str] = Counter()
    lost: dict[str, list[dict[str, str]]] = {}
    kinds: dict[str, dict[str, Any]] = {}
    for src, ref, hyp in zip(sources, refs, hyps, strict=True):
        strict = [(s.start, s.end) for s in spans.find_spans(src)]
        served = verbatim.candidates(src, words, strict)
        found = [(c, RETAINED[c.kind]) for c in served]
        if vocab_words is not None:
            starts = {(c.start, c.end) for c in served}
            broad = verbatim.candidates(src, vocab_words, strict)
            found += [(c, UNMASKED_WORDS) for c in broad if c.kind == "name" and (c.start, c.end) not in starts]
        for c, group in found:
            word = src[c.start : c.end]
            if (ok := _kept(word, src, ref, hyp)) is None:
                continue
            total[group] += 1
            if ok:
                kept[group] += 1
            elif len(lost.setdefault(group, [])) < 5:
                lost[group].append({"word": word, "en": src, "hyp": hyp})
        for s in spans.find_spans(src, True, verbatim=True, words=words):
            word = src[s.start : s.end]
            if (ok := _kept(word, src, ref, hyp)) is None:
                continue
            kind = kinds.setdefault(s.kind, {"kept": 0, "of": 0, "lost": []})
            kind["of"] += 1
            kind["kept"] += ok
            if not ok and len(kind["lost"]) < 5:
                kind["lost"].append({"word": word, "en": src, "hyp": hyp})
    every = sum(n for g, n in total.items() if g != UNMASKED_WORDS)
    every_kept = sum(n for g, n in kept.items() if g != UNMASKED_WORDS)
    return {
        "all": {"kept": every_kept, "of": every, "share": every_kept / every if every else 1.0},
        **{g: {"kept": kept[g], "of": n, "share": kept[g] / n, "lost": lost.get(g, [])} for g, n in total.items()},
        "kinds": {k: {**v, "share": v["kept"] / v["of"]} for k, v in sorted(kinds.items())},
    }


def _kept(word: str, src: str, ref: str, hyp: str) -> bool | None:
    """None when the reference does not keep `word` as written; else whether the translation
    keeps it as often as the source has it."""
    if not verbatim.kept_in(ref, word):
        return None
    return len(verbatim.kept_in(hyp, word)) >= len(verbatim.kept_in(src, word))


def translator_quality(
    engine: TranslatorEngine,
    rows: list[dict[str, str]],
    seen: frozenset[str] = frozenset(),
    params: DecodeParams | None = None,
) -> dict[str, object]:
    """`seen`: English texts of the training split; given, `unseen` scores the rows without them.
    `params`: the decoding measured (default: the model's own, as served); its greedy twin gives
    the dropped-content figure's baseline (`dropped_scores`)."""
    params = params or engine.default_params()
    hyps = translate_rows(engine, [r["en"] for r in rows], params=params)
    greedy = translate_rows(engine, [r["en"] for r in rows], params=replace(params, beam_size=1, num_hypotheses=1))
    refs = [r["de"] for r in rows]
    rep = [repeats_beyond_reference(h, r) for h, r in zip(hyps, refs, strict=True)]
    unseen = [i for i, r in enumerate(rows) if r["en"] not in seen]
    return {
        **translation_scores(hyps, refs),
        **({"unseen": translation_scores([hyps[i] for i in unseen], [refs[i] for i in unseen])} if seen else {}),
        "dropped": dropped_scores(hyps, refs, greedy),
        "retention": retention([r["en"] for r in rows], refs, hyps, engine.codec.words, engine.codec.vocab_words),
        "repeated_examples": [{"hyp": h, "ref": r} for h, r, x in zip(hyps, refs, rep, strict=True) if x][:10],
        "examples": [{"en": r["en"], "ref": r["de"], "hyp": h} for r, h in list(zip(rows, hyps, strict=True))[:10]],
    }


def calibration_error(confidence: list[float], correct: list[bool], bins: int = 15) -> float:
    """Expected calibration error: over equal-width confidence bins, the gap between mean
    confidence and accuracy, weighted by the bin's share of the rows."""
    out = 0.0
    for b in range(bins):
        idx = [i for i, c in enumerate(confidence) if b / bins < c <= (b + 1) / bins or (b == 0 and c == 0)]
        if idx:
            gap = sum(confidence[i] for i in idx) / len(idx) - sum(correct[i] for i in idx) / len(idx)
            out += abs(gap) * len(idx) / len(confidence)
    return out


def encode_fitting(engine: ClassifierEngine, texts: list[str]) -> tuple[list[list[int]], int]:
    """The service's encoding of each text; one longer than the model takes is cut to the longest
    prefix (in characters) that fits, as the training's evaluation truncates (the service itself
    would refuse it with 413). Returns the ids and how many texts were cut."""
    out, cut = [], 0
    for text in texts:
        try:
            out += engine.encode([text])
            continue
        except InputTooLong:
            cut += 1
        lo, hi = 0, len(text)  # lo fits, hi does not
        while hi - lo > 1:
            mid = (lo + hi) // 2
            try:
                engine.encode([text[:mid]])
                lo = mid
            except InputTooLong:
                hi = mid
        out += engine.encode([text[:lo]])
    return out, cut


def classifier_quality(engine: ClassifierEngine, rows: list[dict[str, str]]) -> dict[str, object]:
    from export.metrics import classification_report  # the training's own report, for one definition
    from export.train import vader_baseline

    labels = engine.labels
    texts = [r["text"] for r in rows]
    ids, cut = encode_fitting(engine, texts)
    probs = [p for s in range(0, len(rows), 256) for p in engine.classify_ids(ids[s : s + 256])]
    pred = [int(p.argmax()) for p in probs]
    gold = [labels.index(r["label"]) for r in rows]
    sources = [r.get("source", "all") for r in rows]
    return {
        **classification_report(gold, pred, sources, len(labels)),
        "calibration_error": calibration_error(
            [float(p.max()) for p in probs], [p == g for p, g in zip(pred, gold, strict=True)]
        ),
        "vader": classification_report(gold, vader_baseline(texts), sources, len(labels))["all"],
        "truncated": cut,
    }


SHORT_TEXTS = ROOT / "bench" / "data" / "short_texts.jsonl"


@functools.cache
def stand_in(workdir: Path, data_dir: Path) -> tuple[list[dict[str, str]], frozenset[str]]:
    """The out-of-domain stand-in's rows and the training split's English texts: read once for
    every variant measured."""
    from bench.ood import stand_in_set

    pairs, _ = stand_in_set(workdir, 200)
    train = data_dir / "translation" / "train.jsonl"
    return [{"en": r.en, "de": r.de} for r in pairs], frozenset(json.loads(x)["en"] for x in train.open())


def _dropped(result: dict[str, object]) -> str:
    d = result["dropped"]
    assert isinstance(d, dict)
    return (
        f"shorter than {SHORT_RATIO:.0%} of the reference {d['short_share']:.2%}, "
        f"fewer content words than greedy {d['fewer_content_than_greedy']:.2%} "
        f"(more {d['more_content_than_greedy']:.2%})"
    )


def _shares(result: dict[str, object]) -> str:
    groups = result["retention"]
    assert isinstance(groups, dict)
    kinds = ", ".join(f"{k} {v['kept']}/{v['of']}" for k, v in groups["kinds"].items())
    return ", ".join(f"{g} {v['kept']}/{v['of']}" for g, v in groups.items() if g != "kinds") + f"; per kind {kinds}"


def _accuracy(result: object) -> str:
    assert isinstance(result, dict)
    return (
        f"accuracy {result['all']['accuracy']:.4f} (VADER {result['vader']['accuracy']:.4f}), "
        f"calibration error {result['calibration_error']:.4f}"
    )


def main() -> int:
    p = argparse.ArgumentParser(prog="python -m bench.quality", description=__doc__.split("\n")[0])
    p.add_argument("--store", type=Path, default=ROOT / "model_store")
    p.add_argument("--data-dir", type=Path, default=ROOT / "data")
    p.add_argument("--variants", default="", help="comma list (default: each model's shipped variants)")
    p.add_argument("--threads", type=int, default=0)
    p.add_argument("--ood", action="store_true", help="also the out-of-domain stand-in of bench.ood (apt downloads)")
    p.add_argument("--ood-workdir", type=Path, default=ROOT / "data" / "raw-ood")
    p.add_argument("--length-penalty", type=float, default=None, help="translator (default: the model's)")
    p.add_argument(
        "--early-stopping", choices=("true", "false", "never"), default=None, help="translator (default: the model's)"
    )
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
                params = engine.default_params()
                if args.length_penalty is not None:
                    params = replace(params, length_penalty=args.length_penalty)
                if args.early_stopping is not None:
                    stop = {"true": True, "false": False, "never": "never"}[args.early_stopping]
                    params = replace(params, early_stopping=stop)
                result = translator_quality(engine, rows, params=params)
                print(
                    f"{name} {variant}: BLEU {result['bleu']} chrF {result['chrf']}, "
                    f"repetitions {result['repeated_ngram_share']:.2%}, kept as written {_shares(result)}; "
                    f"{_dropped(result)}",
                    flush=True,
                )
                if args.ood:
                    ood = translator_quality(engine, *stand_in(args.ood_workdir, args.data_dir), params=params)
                    result["ood"], unseen = ood, ood["unseen"]
                    assert isinstance(unseen, dict)
                    print(
                        f"  stand-in: BLEU {ood['bleu']} chrF {ood['chrf']}, "
                        f"repetitions {ood['repeated_ngram_share']:.2%}, kept as written {_shares(ood)}; "
                        f"{_dropped(ood)}; "
                        f"the {unseen['sentences']} messages the training split lacks: "
                        f"BLEU {unseen['bleu']} chrF {unseen['chrf']}"
                    )
            else:
                assert isinstance(engine, ClassifierEngine)
                rows = [json.loads(x) for x in (args.data_dir / "sentiment" / "test.jsonl").read_text().splitlines()]
                result = classifier_quality(engine, rows)
                short = [json.loads(x) for x in SHORT_TEXTS.read_text().splitlines()]
                trained = {json.loads(x)["text"] for x in (args.data_dir / "sentiment" / "train.jsonl").open()}
                result["short_texts"] = classifier_quality(engine, short)
                result["short_texts_in_training"] = sum(r["text"] in trained for r in short)
                print(f"{name} {variant}: {_accuracy(result)}; short texts {_accuracy(result['short_texts'])}")
            results[f"{name}/{entry.version}/{variant}"] = result
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2, ensure_ascii=False) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
