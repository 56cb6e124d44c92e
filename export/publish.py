"""Checkpoint -> validated ONNX model version folder in the model store (`python -m export.publish`).

Nothing is written unless every check of `export.validate` passes; the folder is built hidden in
the store and renamed into place with its manifest written last, so a failed or interrupted
export never leaves a half-written version; an existing version is never overwritten without
`--force`.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import torch
from tokenizers import Tokenizer

from export import figures as figures_lib
from export import validate
from export.graphs import OPSET, export_graphs, graph_io
from export.model import Classifier, Translator
from export.quantize import MAKERS
from export.tokenizer import encode_sources, encode_texts
from export.validate import ExportError
from service.contract.graphs import IO_CONTRACT_VERSION, SPECIAL_IDS
from service.contract.manifest import MANIFEST, Manifest, file_entry

MAX_NEW_TOKENS = 128
CALIBRATION_SENTENCES = 64  # real sentences whose activations set the int8 scales
VARIANTS = ("fp32", *MAKERS)


@dataclass(frozen=True)
class ExportOptions:
    """How one model version is exported, validated and published."""

    name: str
    version: int | None = None  # None: the next free version
    force: bool = False  # overwrite an existing version
    variants: tuple[str, ...] = ("fp32", "int8")  # validated and measured; fp32 is the reference
    default_variant: str = "fp32"
    ship: tuple[str, ...] | None = None  # variants whose files are written; None: all
    labels: tuple[str, ...] = ()  # classifiers
    source_language: str | None = None  # translators (BCP 47)
    target_language: str | None = None
    min_parity_sentences: int = 100
    train_metrics: Mapping[str, object] = field(default_factory=dict)
    data_sources: tuple[Mapping[str, str], ...] = ()
    figures: tuple[Path, ...] = ()  # PNGs kept in the version, named by their stem (the run's curves.png)

    def shipped(self) -> tuple[str, ...]:
        ship = self.ship or self.variants
        if "fp32" not in self.variants:
            raise ExportError("the fp32 variant is the reference for every other and must be exported")
        if unknown := set(self.variants) - set(VARIANTS):
            raise ExportError(f"unknown variant(s) {sorted(unknown)} (choose from {', '.join(VARIANTS)})")
        if not set(ship) <= set(self.variants) or self.default_variant not in ship:
            raise ExportError(
                f"shipped variants {list(ship)} must be exported ({list(self.variants)}) and include "
                f"{self.default_variant!r}"
            )
        return ship


def next_version(store: Path, name: str) -> int:
    folder = store / name
    versions = [int(p.name) for p in folder.iterdir() if p.name.isdigit()] if folder.is_dir() else []
    return max(versions, default=0) + 1


@contextmanager
def staged_version(store: Path, name: str, version: int, force: bool) -> Iterator[Path]:
    """A hidden folder in the store to build a version in; renamed into place when the block
    finishes (the caller writes the manifest last), removed when it fails: a failed or interrupted
    export never leaves a half-written version."""
    final = store / name / str(version)
    if final.exists() and not force:
        raise ExportError(f"{final} exists; pass --force to overwrite it")
    store.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=store))
    try:
        yield tmp
        if final.exists():
            shutil.rmtree(final)
        final.parent.mkdir(parents=True, exist_ok=True)
        tmp.chmod(0o755)
        tmp.rename(final)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def export_model(
    model: Classifier | Translator,
    tok: Tokenizer,
    store: Path,
    options: ExportOptions,
    validation_texts: Sequence[str] = (),
    test_rows: Sequence[dict] = (),
    log: Callable[[str], None] = print,
) -> Path:
    """Export, validate, measure and publish one model version; returns its folder."""
    ship = options.shipped()
    figures_lib.check_extra(options.figures)
    version = options.version or next_version(store, options.name)
    model = model.eval().cpu()
    is_clf = isinstance(model, Classifier)
    c = model.config
    if is_clf:
        max_src = c.max_len
        seqs = encode_texts(tok, validation_texts, max_src) if validation_texts else []
    else:
        max_src = c.max_len - 1  # text tokens; the EOS every source ends with comes on top
        seqs = encode_sources(tok, validation_texts, c.max_len)[0] if validation_texts else []
    report: dict[str, object] = {"train": dict(options.train_metrics)}
    t0 = time.perf_counter()
    with staged_version(store, options.name, version, options.force) as tmp:
        files = {"fp32": export_graphs(model, tmp)}
        with torch.no_grad():
            report |= _validate(model, tmp, files, "fp32", seqs)
            if not is_clf:
                report |= _token_parity(model, tmp, files["fp32"], seqs, options.min_parity_sentences)
            calibration = validate.calibration_feeds(model, tmp, files["fp32"], seqs[:CALIBRATION_SENTENCES])
            for variant in options.variants:
                if variant == "fp32":
                    continue
                files[variant] = {}
                for role, fname in files["fp32"].items():
                    out = fname.replace(".onnx", f".{variant}.onnx")
                    MAKERS[variant](tmp / fname, tmp / out, calibration[role])
                    files[variant][role] = out
                report |= _validate(model, tmp, files, variant, seqs)
            if not is_clf:
                for variant in ship:
                    report |= _batch_invariance(model, tmp, files[variant], variant, seqs, options.min_parity_sentences)
        report["export_seconds"] = round(time.perf_counter() - t0, 1)
        for variant, roles in files.items() if test_rows else ():
            t1 = time.perf_counter()
            if is_clf:
                result = validate.eval_classifier_variant(
                    tmp / roles["model"], tok, test_rows, options.labels, c.max_len
                )
                report[f"test_{variant}"] = result
            else:
                result = validate.eval_translator_variant(
                    tmp / roles["encoder"], tmp / roles["decoder"], model, tok, test_rows
                )
                report[f"test_{variant}_greedy"] = result
            log(f"{options.name}: {variant} on the test split {result} ({time.perf_counter() - t1:.0f}s)")
        # Variants measured but not shipped (to keep a bundled store small) leave no files behind;
        # their parity and test figures stay in the manifest's metrics.
        for variant in [v for v in files if v not in ship]:
            for fname in files.pop(variant).values():
                (tmp / fname).unlink()
        report["shipped_variants"] = list(files)
        tok.save(str(tmp / "tokenizer.json"))
        figures = figures_lib.write_figures(tmp, c.max_len, c.d_model, options.figures)
        manifest = Manifest(
            name=options.name,
            version=version,
            task="classification" if is_clf else "translation",
            io_contract=IO_CONTRACT_VERSION,
            created=datetime.now(UTC).isoformat(timespec="seconds"),
            architecture=dict(asdict(c).items()),
            opset=OPSET,
            graphs=graph_io(model),
            variants=files,
            default_variant=options.default_variant,
            output="logits" if is_clf else "logprobs",
            tokenizer="tokenizer.json",
            special_tokens=SPECIAL_IDS,
            labels=list(options.labels),
            max_source_tokens=max_src,
            max_new_tokens=0 if is_clf else min(MAX_NEW_TOKENS, c.max_len),
            source_language=None if is_clf else options.source_language,
            target_language=None if is_clf else options.target_language,
            metrics=report,
            data_sources=[dict(s) for s in options.data_sources],
            figures=figures,
            files={f: file_entry(tmp / f) for f in sorted(p.name for p in tmp.iterdir())},
        )
        # The manifest is written last: a folder without one is never served.
        (tmp / MANIFEST).write_text(manifest.model_dump_json(indent=2) + "\n")
    return store / options.name / str(version)


def _validate(
    model: Classifier | Translator,
    folder: Path,
    files: dict[str, dict[str, str]],
    variant: str,
    seqs: Sequence[list[int]],
) -> dict[str, object]:
    tol, probs, roles = validate.TOLERANCES[variant], variant in validate.PROBABILITIES_ONLY, files[variant]
    if isinstance(model, Classifier):
        worst = validate.check_classifier(model, folder / roles["model"], seqs, tol, probs)
    elif probs:
        ref = (folder / files["fp32"]["encoder"], folder / files["fp32"]["decoder"])
        got = (folder / roles["encoder"], folder / roles["decoder"])
        held_out = seqs[CALIBRATION_SENTENCES:] or seqs  # not the sentences that set the scales
        worst = validate.check_quantized_translator(model, ref, got, held_out[:32], tol)
    else:
        worst = validate.check_translator(model, folder / roles["encoder"], folder / roles["decoder"], seqs[:16], tol)
    return {f"{variant}_max_abs_diff": worst}


def _token_parity(
    model: Translator, folder: Path, roles: dict[str, str], seqs: Sequence[list[int]], minimum: int
) -> dict[str, object]:
    parity = list(seqs[: max(minimum, 100)])
    if len(parity) < minimum:
        raise ExportError(f"token parity needs at least {minimum} validation sentences, got {len(parity)}")
    max_new = min(MAX_NEW_TOKENS, model.config.max_len)
    rate = validate.check_greedy_tokens(model, folder / roles["encoder"], folder / roles["decoder"], parity, max_new)
    if rate < 1.0:
        raise ExportError(f"cached ONNX greedy differs from PyTorch on {1 - rate:.1%} of {len(parity)} sentences")
    return {"greedy_identical_rate": rate, "greedy_parity_sentences": len(parity)}


def _batch_invariance(
    model: Translator, folder: Path, roles: dict[str, str], variant: str, seqs: Sequence[list[int]], minimum: int
) -> dict[str, object]:
    """One answer per input: each sentence alone, in a batch, and joining a running batch."""
    sample = list(seqs[: max(64, min(minimum, 64))])
    if len(sample) < min(64, minimum):
        raise ExportError(f"batch invariance needs at least {min(64, minimum)} validation sentences, got {len(sample)}")
    max_new = min(MAX_NEW_TOKENS, model.config.max_len)
    enc, dec = folder / roles["encoder"], folder / roles["decoder"]
    differ = validate.check_batch_invariance(enc, dec, model, sample, max_new)
    if differ:
        raise ExportError(f"{variant}: {differ} of {len(sample)} sentences decode differently alone and in a batch")
    return {f"{variant}_batch_invariant_sentences": len(sample)}


def data_sources_of(card: Path, dataset: str) -> tuple[dict[str, str], ...]:
    """Package, version and licence of every source of one dataset, from the data build's card."""
    if not card.is_file():
        raise ExportError(f"{card} not found: run `make data` first (the manifest records the data sources)")
    sources = json.loads(card.read_text()).get(dataset, {}).get("sources", [])
    return tuple({"package": s["name"], "version": s["version"], "license": s.get("licence", "")} for s in sources)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m export.publish", description="Export a trained checkpoint into the model store."
    )
    p.add_argument("checkpoint", type=Path, help="folder with model.safetensors, config.json, tokenizer.json")
    p.add_argument("--name", required=True, help="model name in the store, e.g. sentiment or en-de")
    p.add_argument("--store", type=Path, default=Path("model_store"))
    p.add_argument("--version", type=int, default=None, help="integer version (default: next free)")
    p.add_argument("--force", action="store_true", help="overwrite an existing version")
    p.add_argument("--variants", default="fp32,int8", help=f"comma list of {','.join(VARIANTS)}")
    p.add_argument("--default-variant", default="fp32", help="the variant served unless SERVE_VARIANT says otherwise")
    p.add_argument("--ship", default="", help="variants written to the store (default: all exported)")
    p.add_argument("--data-dir", type=Path, default=Path("data"), help="the validation and test splits come from here")
    p.add_argument("--languages", default="en,de", help="translators: source,target language codes")
    p.add_argument("--threads", type=int, default=2)
    return p


def _list(value: str) -> tuple[str, ...]:
    return tuple(v.strip() for v in value.split(",") if v.strip())


def main(argv: Sequence[str] | None = None) -> int:
    from export.data import SENTIMENT_LABELS, load_jsonl
    from export.train import load_checkpoint

    args = build_parser().parse_args(argv)
    torch.set_num_threads(args.threads)
    try:
        model, tok = load_checkpoint(args.checkpoint)
        is_clf = isinstance(model, Classifier)
        sub = "sentiment" if is_clf else "translation"
        test_file, valid_file = args.data_dir / sub / "test.jsonl", args.data_dir / sub / "valid.jsonl"
        for f in (test_file, valid_file):
            if not f.is_file():
                raise ExportError(f"{f} not found: run `make data` first (validation uses real sentences)")
        test_rows = load_jsonl(test_file)
        # parity, batch invariance and int8 calibration on the validation split; the figures of
        # every variant on the test split, which nothing else has seen
        texts = [r["text"] if is_clf else r["en"] for r in load_jsonl(valid_file)]
        report_file = args.checkpoint / "report.json"
        train_report = json.loads(report_file.read_text()) if report_file.is_file() else {}
        curves = args.checkpoint / "curves.png"  # written by export.train
        source, target = (_list(args.languages) + (None, None))[:2]
        options = ExportOptions(
            name=args.name,
            version=args.version,
            force=args.force,
            variants=_list(args.variants),
            default_variant=args.default_variant,
            ship=_list(args.ship) or None,
            labels=SENTIMENT_LABELS if is_clf else (),
            source_language=source,
            target_language=target,
            train_metrics={k: v for k, v in train_report.items() if k not in ("curves", "examples", "args")},
            data_sources=data_sources_of(args.data_dir / "datacard.json", sub),
            figures=(curves,) if curves.is_file() else (),
        )
        folder = export_model(model, tok, args.store, options, validation_texts=texts[:200], test_rows=test_rows)
    except (ExportError, FileNotFoundError, ValueError) as exc:
        print(f"export failed: {exc}", file=sys.stderr)
        return 1
    manifest = json.loads((folder / MANIFEST).read_text())
    print(json.dumps({"folder": str(folder), "files": manifest["files"], "metrics": manifest["metrics"]}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
