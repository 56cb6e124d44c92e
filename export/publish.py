"""Model -> validated ONNX model version folder in the model store (`python -m export.publish`).

`publish` runs the same steps for every kind of model; what differs between kinds is the spec's
(`export.specs`). Nothing is written unless every check passes; the folder is built hidden in the
store and renamed into place with its manifest written last, so a failed or interrupted export
never leaves a half-written version; an existing version is never overwritten without `--force`.
`export_model` and the CLI publish the project's own checkpoints, `export.import_hf` imported ones.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path

import torch
from tokenizers import Tokenizer
from torch import nn

from export.cli import HelpFormatter, data_file, quiet, summary
from export.graphs import OPSET
from export.quantize import CALIBRATED, MAKERS
from export.specs import VARIANTS, ModelSpec, PublishOptions
from export.specs.bundled import ExportOptions, spec_for
from export.validate import ExportError
from service.contract import verbatim
from service.contract.graphs import IO_CONTRACT_VERSION
from service.contract.manifest import (
    LANGUAGE_CODE_PATTERN,
    MANIFEST,
    MAX_MODEL_NAME,
    MODEL_NAME_PATTERN,
    Generation,
    Manifest,
    file_entry,
    is_version_folder,
)

MAX_VERSION = 2**31 - 1  # a version every client reads exactly (JSON numbers past 2^53 are not)


def next_version(store: Path, name: str) -> int:
    folder = store / name
    versions = [int(p.name) for p in folder.iterdir() if is_version_folder(p.name)] if folder.is_dir() else []
    return max(versions, default=0) + 1


def check_target(store: Path, name: str, version: int | None, task: str) -> None:
    """Refuses, before any work, a name or version the store could not take, and a name whose
    versions are of another task (publishing there would change what the name serves)."""
    if len(name) > MAX_MODEL_NAME or not re.match(MODEL_NAME_PATTERN, name):
        raise ExportError(
            f"--name must be 1 to {MAX_MODEL_NAME} of a-z, 0-9, '.', '_' and '-', starting with a letter or digit"
        )
    if version is not None and not 1 <= version <= MAX_VERSION:
        raise ExportError(f"--version must be between 1 and {MAX_VERSION}")
    if store.exists() and not store.is_dir():
        raise ExportError(f"the store {store} is not a folder")
    folder = store / name
    if folder.exists() and not folder.is_dir():
        raise ExportError(f"{folder} is not a folder")
    for path in sorted(folder.glob("[0-9]*/manifest.json")) if folder.is_dir() else []:
        try:
            held = json.loads(path.read_text()).get("task")
        except (OSError, ValueError):
            continue
        if held is not None and held != task:
            raise ExportError(f"{name} holds {held} models; this one is {task}: publish it under another --name")


@contextmanager
def staged_version(store: Path, name: str, version: int, force: bool) -> Iterator[Path]:
    """A hidden folder in the store to build a version in; renamed into place when the block
    finishes (the caller writes the manifest last), removed when it fails: a failed or interrupted
    export never leaves a half-written version."""
    final = store / name / str(version)
    if final.exists() and not force:
        raise ExportError(f"{final} exists; pass --force to overwrite it")
    main = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _exit_on_signal) if main else None  # unwinds: the staging goes
    store.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=store))
    old: Path | None = None
    try:
        yield tmp
        final.parent.mkdir(parents=True, exist_ok=True)
        tmp.chmod(0o755)
        # the old folder is renamed aside, not removed in place: a watching server never scans a
        # half-deleted version, only the old folder or the new one (or, between two renames, none)
        if final.exists() and not force:  # another export published it meanwhile: never replaced unasked
            raise ExportError(f"{final} was published by another export meanwhile; run again for the next version")
        old = Path(tempfile.mkdtemp(prefix=f".{name}-old-", dir=store)) if final.exists() else None
        if old is not None:
            final.rename(old / "version")
        try:
            tmp.rename(final)
        except OSError:
            if old is not None:  # the old version stays published
                (old / "version").rename(final)
            raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
        if main:
            signal.signal(signal.SIGTERM, previous)


def _exit_on_signal(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


def publish(
    spec: ModelSpec,
    store: Path,
    options: PublishOptions,
    log: Callable[[str], None] = print,
    started: float | None = None,
) -> Path:
    """Export, validate, measure and publish one model version; returns its folder. `started`: when
    the work began, if before this call (an import counts loading the checkpoint)."""
    ship = options.shipped()
    check_target(store, options.name, options.version, spec.task)
    version = options.version if options.version is not None else next_version(store, options.name)
    report = spec.first_metrics()
    t0 = time.perf_counter() if started is None else started
    with staged_version(store, options.name, version, options.force) as tmp:
        files = {"fp32": spec.write_graphs(tmp)}
        derived = [v for v in options.variants if v != "fp32"]
        with torch.no_grad():
            report |= spec.check_reference(tmp, files["fp32"])
            calibration = spec.calibration_feeds(tmp, files["fp32"]) if CALIBRATED & set(derived) else {}
            for variant in derived:
                files[variant] = {}
                for role, fname in files["fp32"].items():
                    out = fname.replace(".onnx", f".{variant}.onnx")
                    MAKERS[variant](tmp / fname, tmp / out, calibration.get(role, []))
                    files[variant][role] = out
                report |= spec.check_variant(variant, tmp, files)
            for variant in ship:
                report |= spec.check_batches(variant, tmp, files[variant])
                log(f"{options.name}: {variant} written and checked")
        report[spec.seconds_metric] = round(time.perf_counter() - t0, 1)
        for variant, roles in files.items():
            t1 = time.perf_counter()
            for key, result in spec.evaluate(variant, tmp, roles).items():
                report[key] = result
                log(f"{options.name}: {variant} on the test split {result} ({time.perf_counter() - t1:.0f}s)")
        report["publish_seconds"] = round(time.perf_counter() - t0, 1)
        # Variants measured but not shipped (to keep a bundled store small) leave no files behind;
        # their parity and test figures stay in the manifest's metrics.
        for variant in [v for v in files if v not in ship]:
            for fname in files.pop(variant).values():
                (tmp / fname).unlink()
        report["shipped_variants"] = list(files)
        tokenizer = spec.write_tokenizer(tmp)
        figures = spec.write_extras(tmp, options.name, version, report)
        manifest = Manifest(
            name=options.name,
            version=version,
            task=spec.task,
            io_contract=IO_CONTRACT_VERSION,
            created=datetime.now(UTC).isoformat(timespec="seconds"),
            opset=OPSET,
            variants=files,
            default_variant=options.default_variant,
            output=spec.output,
            tokenizer=tokenizer,
            metrics=report,
            figures=figures,
            files={f: file_entry(tmp / f) for f in sorted(p.name for p in tmp.iterdir())},
            **spec.describe().fields(),  # type: ignore[arg-type]
        )
        # The manifest is written last: a folder without one is never served.
        (tmp / MANIFEST).write_text(manifest.model_dump_json(indent=2) + "\n")
    return store / options.name / str(version)


def export_model(
    model: nn.Module,
    tok: Tokenizer,
    store: Path,
    options: ExportOptions,
    validation_texts: Sequence[str] = (),
    test_rows: Sequence[dict] = (),
    log: Callable[[str], None] = print,
) -> Path:
    """Export, validate, measure and publish one of the project's own models; returns its folder.
    Validation (parity, batch invariance, int8 calibration) runs on `validation_texts`, the figures
    of every variant on `test_rows`."""
    spec = spec_for(model)(model, tok, options, validation_texts, test_rows)
    return publish(spec, store, options, log)


def data_sources_of(data_dir: Path, dataset: str) -> tuple[dict[str, str], ...]:
    """Package, version and licence of every source of one dataset, from the data build's card."""
    card = data_file(data_dir, "datacard.json", why="run `make data` first (the manifest records the data sources)")
    sources = json.loads(card.read_text()).get(dataset, {}).get("sources", [])
    return tuple({"package": s["name"], "version": s["version"], "license": s.get("licence", "")} for s in sources)


def build_parser(prog: str = "python -m export.publish") -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=prog,
        description="Export a trained checkpoint into the model store.",
        formatter_class=HelpFormatter,
    )
    p.add_argument("checkpoint", type=Path, help="folder with model.safetensors, config.json, tokenizer.json")
    p.add_argument("--name", required=True, help="model name in the store, e.g. sentiment or en-de")
    p.add_argument("--store", type=Path, default=Path("model_store"), help="the model store folder")
    p.add_argument("--version", type=int, default=None, help="integer version (default: the next free one)")
    p.add_argument("--force", action="store_true", help="overwrite an existing version")
    p.add_argument("--variants", default="fp32,int8", help=f"variants exported and checked, from {','.join(VARIANTS)}")
    p.add_argument("--default-variant", default="fp32", help="the variant served unless SERVE_VARIANT says otherwise")
    p.add_argument("--ship", default="", help="variants written to the store (default: all exported)")
    p.add_argument(
        "--data-dir",
        type=Path,
        default=Path("data"),
        help="the built datasets (`make data`: splits, datacard.json), relative to the working directory",
    )
    p.add_argument("--languages", default="en,de", help="translators: source,target language codes")
    p.add_argument("--length-penalty", type=float, default=1.0, help="translators: the default length penalty (0-2)")
    p.add_argument(
        "--early-stopping",
        choices=("true", "false", "never"),
        default="true",
        help="translators: when beam search stops by default (docs/engine.md)",
    )
    p.add_argument(
        "--test-rows",
        type=int,
        default=ExportOptions.test_rows,
        help="test-split rows each variant's figures are measured on, spread over the split (0: the whole "
        "split, as the bundled models were; the parity and batch checks do not depend on it)",
    )
    p.add_argument("--threads", type=int, default=2, help="PyTorch and ONNX Runtime threads")
    p.add_argument("--verbose", action="store_true", help="progress, third-party warnings and the whole manifest")
    return p


def _list(value: str) -> tuple[str, ...]:
    return tuple(v.strip() for v in value.split(",") if v.strip())


def main(argv: Sequence[str] | None = None, prog: str = "python -m export.publish") -> int:
    from export.data import load_jsonl
    from export.train import load_checkpoint

    args = build_parser(prog).parse_args(argv)
    if args.threads < 1:
        print("export failed: --threads must be at least 1", file=sys.stderr)
        return 1
    torch.set_num_threads(args.threads)
    try:
        model, tok = load_checkpoint(args.checkpoint)
        kind = spec_for(model)
        sub = kind.dataset
        why = "run `make data` first (validation uses real sentences)"
        test_file, valid_file = (data_file(args.data_dir, sub, f"{s}.jsonl", why=why) for s in ("test", "valid"))
        test_rows = load_jsonl(test_file)
        # parity, batch invariance and int8 calibration on the validation split; the figures of
        # every variant on the test split, which nothing else has seen
        texts = [r[kind.text_field] for r in load_jsonl(valid_file)]
        for split, rows in (("test", test_rows), ("valid", texts)):
            if not rows:
                raise ExportError(f"{sub}/{split}.jsonl has no rows: the checks and figures need real sentences")
        if args.test_rows < 0:
            raise ExportError("--test-rows must be 0 (the whole split) or more")
        languages = _list(args.languages)
        codes = all(re.match(LANGUAGE_CODE_PATTERN, code) for code in languages)
        if kind.dataset == "translation" and (len(languages) != 2 or not codes):
            raise ExportError("--languages must be two language codes, source,target (e.g. en,de)")
        report_file = args.checkpoint / "report.json"
        train_report = json.loads(report_file.read_text()) if report_file.is_file() else {}
        curves = args.checkpoint / "curves.png"  # written by export.train
        span_rules = int(train_report.get("span_rules", 1))
        common = frozenset[str]()
        if span_rules >= 2:  # names are masked: the training text says which capitalised words are words
            train_file = data_file(args.data_dir, sub, "train.jsonl", why=why)
            common = verbatim.common_words(r[kind.text_field] for r in load_jsonl(train_file))
        source, target = (_list(args.languages) + (None, None))[:2]
        options = ExportOptions(
            name=args.name,
            version=args.version,
            force=args.force,
            variants=_list(args.variants),
            default_variant=args.default_variant,
            ship=_list(args.ship) or None,
            labels=kind.dataset_labels,
            source_language=source,
            target_language=target,
            generation=Generation(
                length_penalty=args.length_penalty,
                early_stopping={"true": True, "false": False, "never": "never"}[args.early_stopping],
            ),
            train_metrics={k: v for k, v in train_report.items() if k not in ("curves", "examples", "args")},
            span_rules=span_rules,
            common_words=common,
            data_sources=data_sources_of(args.data_dir, sub),
            figures=(curves,) if curves.is_file() else (),
            test_rows=args.test_rows,
        )
        log = print if args.verbose else _silent
        with quiet(args.verbose):
            folder = export_model(model, tok, args.store, options, texts[:200], test_rows, log)
    except (ExportError, OSError, ValueError) as exc:
        print(f"export failed: {exc}", file=sys.stderr)
        return 1
    except (KeyboardInterrupt, SystemExit) as exc:  # Ctrl-C, SIGTERM (staged_version's handler)
        print("export interrupted: nothing was published", file=sys.stderr)
        return 130 if isinstance(exc, KeyboardInterrupt) else int(exc.code or 1)
    except Exception as exc:  # a checkpoint the loaders cannot read (truncated weights, a broken config)
        print(f"export failed: {type(exc).__name__}: {exc} (--verbose shows where)", file=sys.stderr)
        if args.verbose:
            raise
        return 1
    manifest = json.loads((folder / MANIFEST).read_text())
    try:
        if args.verbose:  # the whole report, as scripts have read it
            report = {"folder": str(folder), "files": manifest["files"], "metrics": manifest["metrics"]}
            print(json.dumps(report, indent=2))
        else:
            print("\n".join(summary(folder, manifest)))
        sys.stdout.flush()
    except BrokenPipeError:  # `| head`: published all the same
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 0


def _silent(_: str) -> None:
    pass


if __name__ == "__main__":
    raise SystemExit(main())
