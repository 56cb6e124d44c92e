"""A local Hugging Face checkpoint -> a validated model version in the store (`python -m export.import_hf`).

    python -m export.import_hf DIR --name NAME [--store model_store] [--version N] [--variants fp32,fp16] [--verbose]

DIR is a `save_pretrained` folder: config.json, safetensors weights, tokenizer files and, for a
translator, generation_config.json. Nothing is downloaded (a hub name is refused) and pickle
weights are never unpickled. The graphs are checked against transformers before anything is
written; `export.publish.publish` writes the version folder, whole or not at all, from the spec of
the checkpoint's family (`export.specs.imported`). Exit 2 with one message naming the problem when
the checkpoint cannot be served.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import torch
import transformers

from export.cli import HelpFormatter, quiet, summary
from export.hf import ImportProblem
from export.hf.families import family_of
from export.hf.tokenizer import convert_tokenizer
from export.publish import publish
from export.quantize import MAKERS
from export.specs import PublishOptions
from export.specs.imported import ImportOptions, spec_for
from export.validate import ExportError
from service.contract.manifest import MANIFEST

PICKLE_WEIGHTS = ("pytorch_model.bin", "pytorch_model.bin.index.json", "tf_model.h5", "flax_model.msgpack")


def check_folder(folder: Path) -> None:
    """A local save_pretrained folder with safetensors weights, or ImportProblem."""
    if not folder.is_dir():
        hint = " (a hub name? the importer never downloads: save_pretrained the model and pass its folder)"
        looks_like_hub = re.fullmatch(r"[\w.-]+/[\w.-]+", str(folder)) is not None
        raise ImportProblem(f"{folder}: no such directory{hint if looks_like_hub else ''}")
    if not (folder / "config.json").is_file():
        raise ImportProblem(f"{folder}: no config.json (not a save_pretrained folder)")
    if not any(folder.glob("*.safetensors")):
        pickles = [p for p in PICKLE_WEIGHTS if (folder / p).exists()]
        if pickles:
            raise ImportProblem(
                f"{folder}: only pickle weights ({', '.join(pickles)}), which are never unpickled: "
                "save the model with save_pretrained(safe_serialization=True) for safetensors"
            )
        raise ImportProblem(f"{folder}: missing weights (no *.safetensors file)")


def import_checkpoint(folder: Path, store: Path, options: ImportOptions, log=print) -> Path:  # type: ignore[no-untyped-def]
    """Import, validate and publish one version; returns its folder."""
    t0 = time.perf_counter()
    check_folder(folder)
    for v in options.variants:
        if v != "fp32" and v not in MAKERS:
            raise ImportProblem(f"unknown variant {v!r} (choose from fp32, {', '.join(MAKERS)})")
    if "int8" in options.variants and not options.calibration:
        raise ImportProblem("int8 needs --calibration FILE: real sentences set its activation scales")
    try:
        config = transformers.AutoConfig.from_pretrained(folder, local_files_only=True)
    except (ValueError, OSError, KeyError) as exc:
        raise ImportProblem(f"{folder}/config.json: {exc}") from exc
    family = family_of(config)
    kind = spec_for(family)
    if kind.task != "translation" and (options.task or options.prefix):
        raise ImportProblem(
            f"--task and --prefix are for encoder-decoders; a {config.model_type} classifier has neither"
        )
    # fp32 is always made (the reference); the rest as asked, when the kind is published in them
    variants = tuple(dict.fromkeys(("fp32", *options.variants)))
    if unmade := [v for v in variants if v not in kind.made_variants]:
        made = ", ".join(kind.made_variants)
        raise ImportProblem(f"a {config.model_type} checkpoint is published in {made} only, not {', '.join(unmade)}")
    family.check(config)
    tok = convert_tokenizer(folder, config, family.tokenization_for(folder))
    spec = kind.load(folder, config, family, tok, options)
    target = PublishOptions(options.name, options.version, options.force, variants, options.default_variant)
    return publish(spec, store, target, log, started=t0)


def build_parser(prog: str = "python -m export.import_hf") -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n")[0], formatter_class=HelpFormatter)
    p.add_argument("checkpoint", type=Path, help="a local save_pretrained folder")
    p.add_argument("--name", required=True, help="model name in the store")
    p.add_argument("--store", type=Path, default=Path("model_store"), help="the model store folder")
    p.add_argument("--version", type=int, default=None, help="integer version (default: the next free one)")
    p.add_argument("--force", action="store_true", help="overwrite an existing version")
    p.add_argument("--variants", default="fp32", help="comma list of fp32,fp16,int8 (int8 needs --calibration)")
    p.add_argument("--default-variant", default="fp32", help="the variant served unless SERVE_VARIANT says otherwise")
    p.add_argument(
        "--calibration", type=Path, default=None, help="a text file, one sentence per line (int8; default: none)"
    )
    p.add_argument(
        "--languages", default="", help="a one-pair translator's source,target, e.g. en,de (default: the checkpoint's)"
    )
    p.add_argument(
        "--task",
        choices=("translation", "text2text"),
        default=None,
        help="an encoder-decoder's task (default: text2text for T5 and BART, translation for the others "
        "or when --languages is given)",
    )
    p.add_argument(
        "--prefix", default="", help='text2text: prepended to every input, e.g. "summarize: " (default: none)'
    )
    p.add_argument("--threads", type=int, default=2, help="PyTorch and ONNX Runtime threads")
    p.add_argument("--verbose", action="store_true", help="progress, third-party warnings and every metric")
    return p


def main(argv: Sequence[str] | None = None, prog: str = "python -m export.import_hf") -> int:
    args = build_parser(prog).parse_args(argv)
    torch.set_num_threads(args.threads)
    try:
        texts = tuple(args.calibration.read_text().splitlines()) if args.calibration else ()
        options = ImportOptions(
            name=args.name,
            version=args.version,
            force=args.force,
            variants=tuple(v.strip() for v in args.variants.split(",") if v.strip()),
            default_variant=args.default_variant,
            calibration=texts,
            languages=_pair(args.languages),
            task=args.task,
            prefix=args.prefix,
        )
        with quiet(args.verbose):
            folder = import_checkpoint(args.checkpoint, args.store, options, print if args.verbose else _silent)
    except (ImportProblem, ExportError, OSError) as exc:
        print(f"import failed: {exc}", file=sys.stderr)
        return 2
    manifest = json.loads((folder / MANIFEST).read_text())
    if args.verbose:  # every metric, as scripts have read it
        print(json.dumps({"folder": str(folder), "metrics": manifest["metrics"]}, indent=2))
    else:
        print("\n".join(summary(folder, manifest)))
    return 0


def _silent(_: str) -> None:
    pass


def _pair(value: str) -> tuple[str, str] | None:
    codes = [v.strip() for v in value.split(",") if v.strip()]
    if not codes:
        return None
    if len(codes) != 2:
        raise SystemExit(f"--languages takes source,target, got {value!r}")
    return codes[0], codes[1]


if __name__ == "__main__":
    raise SystemExit(main())
