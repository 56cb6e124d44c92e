"""A local Hugging Face checkpoint -> a validated model version in the store (`python -m export.import_hf`).

    python -m export.import_hf DIR --name NAME [--store model_store] [--version N] [--variants fp32,fp16]

DIR is a `save_pretrained` folder: config.json, safetensors weights, tokenizer files and, for a
translator, generation_config.json. Nothing is downloaded (a hub name is refused) and pickle
weights are never unpickled. The graphs are checked against transformers before anything is
written; the version folder appears whole or not at all, as `export.publish` writes it. Exit 2
with one message naming the problem when the checkpoint cannot be served.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import torch

from export.graphs import OPSET, graph_io
from export.hf import ImportProblem
from export.publish import MAX_NEW_TOKENS, next_version, staged_version
from export.quantize import MAKERS
from export.validate import TOLERANCES, ExportError
from service.contract.graphs import IO_CONTRACT_VERSION
from service.contract.manifest import MANIFEST, Framing, Generation, Manifest, file_entry

PICKLE_WEIGHTS = ("pytorch_model.bin", "pytorch_model.bin.index.json", "tf_model.h5", "flax_model.msgpack")
# generation_config.json options the engine does not implement, with the values that mean "off"
_OFF: dict[str, tuple[object, ...]] = {
    "do_sample": (False, None),
    "num_beam_groups": (1, None),
    "diversity_penalty": (0.0, None),
    "min_length": (0, None),
    "min_new_tokens": (0, None),
    "repetition_penalty": (1.0, None),
    "encoder_no_repeat_ngram_size": (0, None),
    "forced_decoder_ids": (None,),
    "begin_suppress_tokens": (None,),
    "exponential_decay_length_penalty": (None,),
    "sequence_bias": (None,),
    "constraints": (None,),
    "force_words_ids": (None,),
}


@dataclass(frozen=True)
class ImportOptions:
    name: str
    version: int | None = None
    force: bool = False
    variants: tuple[str, ...] = ("fp32",)
    default_variant: str = "fp32"
    calibration: tuple[str, ...] = ()  # texts whose activations set the int8 scales
    languages: tuple[str, str] | None = None  # a monolingual translator's source and target (BCP 47)


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


def generation_of(gen: object) -> tuple[Generation, dict[str, object]]:
    """The decoding defaults of the model's generation config (what `generate` uses: its
    generation_config.json, else its config.json) and the raw options kept."""
    for option, off in _OFF.items():
        value = getattr(gen, option, None)
        if value not in off:
            raise ImportProblem(f"generation_config: {option}={value!r} is not supported by the engine")
    for words in gen.bad_words_ids or []:
        if len(words) != 1:
            raise ImportProblem(f"generation_config: bad_words_ids {words} of several tokens are not supported")
    stopping = False if gen.early_stopping is None else gen.early_stopping  # None: transformers' default
    if stopping not in (True, False, "never"):
        raise ImportProblem(f"generation_config: early_stopping={gen.early_stopping!r} is not supported")
    if (gen.num_beams or 1) > 8:
        raise ImportProblem(f"generation_config: num_beams={gen.num_beams} (the engine's beams are at most 8)")
    defaults = Generation(
        beam_size=int(gen.num_beams or 1),
        length_penalty=float(gen.length_penalty if gen.length_penalty is not None else 1.0),
        early_stopping=stopping,
        no_repeat_ngram_size=int(gen.no_repeat_ngram_size or 0),
        forced_eos=gen.forced_eos_token_id is not None,
    )
    return defaults, gen.to_diff_dict()  # type: ignore[attr-defined]


def _suppressed(gen: dict[str, object]) -> tuple[int, ...]:
    ids = [w[0] for w in gen.get("bad_words_ids") or []]  # type: ignore[union-attr]
    ids += list(gen.get("suppress_tokens") or [])  # type: ignore[arg-type]
    return tuple(sorted(set(ids)))


def _licence(folder: Path) -> str | None:
    """The model card's `license:` front-matter field, when the folder has a README.md."""
    card = folder / "README.md"
    if not card.is_file():
        return None
    match = re.search(r"^---\n(.*?)\n---", card.read_text(errors="replace"), re.S)
    field = re.search(r"^license:\s*(\S+)", match.group(1), re.M) if match else None
    return field.group(1) if field else None


def _probe_sources(vocab: int, skip: set[int], count: int, seed: int = 0) -> list[list[int]]:
    """Synthetic sources of mixed lengths from the vocabulary's ordinary ids (no data is needed)."""
    rng = np.random.default_rng(seed)
    pool = np.array([i for i in range(vocab) if i not in skip])
    return [rng.choice(pool, size=int(n)).tolist() for n in rng.integers(3, 24, size=count)]


def import_checkpoint(folder: Path, store: Path, options: ImportOptions, log=print) -> Path:  # type: ignore[no-untyped-def]
    """Import, validate and publish one version; returns its folder."""
    import transformers

    from export.hf import classifiers, seq2seq
    from export.hf.tokenizer import import_tokenizer

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
    kind = config.model_type
    is_translator = kind in seq2seq.FAMILIES
    if not is_translator and kind not in classifiers.FAMILIES:
        families = ", ".join(sorted([*seq2seq.FAMILIES, *classifiers.FAMILIES]))
        raise ImportProblem(f"unsupported model family {kind!r} (supported: {families})")
    (seq2seq.check_supported if is_translator else classifiers.check_supported)(config)
    tok = import_tokenizer(folder, config)
    auto = transformers.AutoModelForSeq2SeqLM if is_translator else transformers.AutoModelForSequenceClassification
    try:
        hf = auto.from_pretrained(folder, local_files_only=True, use_safetensors=True, dtype=torch.float32).eval()
    except (ValueError, OSError, RuntimeError) as exc:
        raise ImportProblem(f"{folder}: weights do not load: {exc}") from exc
    version = options.version or next_version(store, options.name)
    report: dict[str, object] = {}
    with staged_version(store, options.name, version, options.force) as tmp:
        if is_translator:
            generation, raw = generation_of(hf.generation_config)
            start = hf.generation_config.decoder_start_token_id
            if start is None:
                start = config.decoder_start_token_id
            if start is None:
                raise ImportProblem("no decoder_start_token_id in generation_config.json or config.json")
            model = seq2seq.Seq2Seq(hf, int(start), _suppressed(raw))  # type: ignore[arg-type]
            files = {"fp32": seq2seq.export_translator(model, tmp)}
            skip = set(tok.special_ids)
            probes = _probe_sources(model.config.vocab_size, skip, 8)
            probes = [
                [*tok.sources[next(iter(tok.sources))].prefix, *p, *tok.sources[next(iter(tok.sources))].suffix]
                for p in probes
            ]
            report |= seq2seq.check_against_transformers(hf, model, tmp, files["fp32"], probes, TOLERANCES["fp32"])
            spec = graph_io(model)
            max_src = model.config.max_len - max(len(f.prefix) + len(f.suffix) for f in tok.sources.values())
            max_new = min(MAX_NEW_TOKENS, model.config.max_len - 1, int(raw.get("max_length") or 10**6) - 1)
            report |= _variants(model, tmp, files, options, tok, probes, log)
        else:
            generation, raw = Generation(), {}
            files = {"model": "model.onnx"}
            classifiers.export_classifier(hf, tmp / "model.onnx")
            files = {"fp32": files}
            spec = {"model": classifiers.graph_spec(config)}
            frame = tok.sources[""]
            max_src = classifiers.max_sequence_length(config) - len(frame.prefix) - len(frame.suffix)
            max_new = 0
            report["transformers_checked"] = "logits and attentions on 5 padded batches, max abs diff <= 1e-4"
        tok.tokenizer.save(str(tmp / "tokenizer.json"))
        report["import_seconds"] = round(time.perf_counter() - t0, 1)
        origin = {
            "family": kind,
            "architectures": list(config.architectures or []),
            "licence": _licence(folder),
            "config": config.to_diff_dict(),
            "generation_config": raw,
        }
        (tmp / "CARD.md").write_text(_card(options.name, version, origin, report))
        sources = {code: Framing(prefix=list(f.prefix), suffix=list(f.suffix)) for code, f in tok.sources.items()}
        specials = {"pad_id": tok.pad_id, "unk_id": tok.unk_id}
        languages = {"source_language": None, "target_language": None}
        if is_translator:
            languages = {
                "source_language": _default_language(folder, "src_lang", tok.sources),
                "target_language": _default_target(raw, tok.targets),
            } | _named_pair(options, tok.sources)
        if is_translator:
            specials |= {"bos_id": int(start), "eos_id": int(config.eos_token_id), "decoder_start_id": int(start)}
        manifest = Manifest(
            name=options.name,
            version=version,
            task="translation" if is_translator else "classification",
            io_contract=IO_CONTRACT_VERSION,
            created=datetime.now(UTC).isoformat(timespec="seconds"),
            architecture=_architecture(config, is_translator),
            opset=OPSET,
            graphs=spec,
            variants=files,
            default_variant=options.default_variant,
            output="logprobs" if is_translator else "logits",
            tokenizer="tokenizer.json",
            special_tokens=specials,
            labels=classifiers.labels(config) if not is_translator else [],
            max_source_tokens=max_src,
            max_new_tokens=max_new,
            **languages,
            sources=sources,
            targets={code: list(ids) for code, ids in (_targets(raw, tok.targets) if is_translator else {}).items()},
            generation=generation,
            skip_ids=list(tok.special_ids),
            origin=origin,
            metrics=report,
            files={f.name: file_entry(f) for f in sorted(tmp.iterdir())},
        )
        (tmp / MANIFEST).write_text(manifest.model_dump_json(indent=2) + "\n")
    return store / options.name / str(version)


def _variants(model, folder: Path, files: dict, options: ImportOptions, tok, probes, log) -> dict[str, object]:  # type: ignore[no-untyped-def]
    """fp16 / int8 graphs made from the fp32 ones, and the batch-invariance gate for every variant."""
    from export import validate

    report: dict[str, object] = {}
    calibration = {}
    if "int8" in options.variants:
        frame = tok.sources[next(iter(tok.sources))]
        seqs = [[*frame.prefix, *e.ids, *frame.suffix] for e in tok.tokenizer.encode_batch(list(options.calibration))]
        calibration = validate.calibration_feeds(model, folder, files["fp32"], seqs[:64])
    for variant in options.variants:
        if variant != "fp32":
            files[variant] = {}
            for role, fname in files["fp32"].items():
                out = fname.replace(".onnx", f".{variant}.onnx")
                MAKERS[variant](folder / fname, folder / out, calibration.get(role, []))
                files[variant][role] = out
        roles = files[variant]
        sample = probes[:8]
        differ = validate.check_batch_invariance(
            folder / roles["encoder"], folder / roles["decoder"], model, sample, 16
        )
        if differ:
            raise ExportError(f"{variant}: {differ} of {len(sample)} sentences decode differently alone and in a batch")
        report[f"{variant}_batch_invariant_sentences"] = len(sample)
        log(f"{options.name}: {variant} written and checked")
    return report


def _named_pair(options: ImportOptions, sources: dict[str, object]) -> dict[str, str]:
    """--languages for a model that does not name its languages (Marian, BART)."""
    if options.languages is None:
        return {}
    if [k for k in sources if k]:
        raise ImportProblem("--languages is for models of one language pair; this one names its own languages")
    return {"source_language": options.languages[0], "target_language": options.languages[1]}


def _architecture(config: object, translator: bool) -> dict[str, int | float | str]:
    c = config
    if translator:
        return {
            "family": c.model_type,  # type: ignore[attr-defined]
            "d_model": c.d_model,  # type: ignore[attr-defined]
            "n_heads": c.decoder_attention_heads,  # type: ignore[attr-defined]
            "n_layers": c.encoder_layers,  # type: ignore[attr-defined]
            "n_dec_layers": c.decoder_layers,  # type: ignore[attr-defined]
            "vocab_size": c.vocab_size,  # type: ignore[attr-defined]
        }
    return {"family": c.model_type, "vocab_size": c.vocab_size}  # type: ignore[attr-defined]


def _targets(raw: dict[str, object], targets: dict[str, tuple[int, ...]]) -> dict[str, tuple[int, ...]]:
    """Per target language the forced first tokens, as `generate` forces them: a multilingual model's
    language token; a monolingual model's `forced_bos_token_id` when its generation config sets one."""
    if [k for k in targets if k]:
        return targets
    forced = raw.get("forced_bos_token_id")
    return {"": (int(forced),) if forced is not None else ()}  # type: ignore[call-overload]


def _default_target(raw: dict[str, object], targets: dict[str, tuple[int, ...]]) -> str | None:
    """The language whose token the generation config forces, if any: a request may leave it out."""
    forced = raw.get("forced_bos_token_id")
    return next((k for k, ids in targets.items() if k and ids and ids[0] == forced), None)


def _default_language(folder: Path, attribute: str, sources: dict[str, object]) -> str | None:
    cfg = folder / "tokenizer_config.json"
    value = json.loads(cfg.read_text()).get(attribute) if cfg.is_file() else None
    return value if value in sources else None


def _card(name: str, version: int, origin: dict[str, object], report: dict[str, object]) -> str:
    lines = [
        f"# {name} version {version}",
        "",
        f"Imported from a `{origin['family']}` checkpoint ({', '.join(origin['architectures']) or '-'}) "  # type: ignore[arg-type]
        "by `python -m export.import_hf`.",
        f"Licence: {origin['licence'] or 'not stated in the source model card'}.",
        "",
        "## Validation against transformers",
        "",
        *[f"- {k}: {v}" for k, v in report.items()],
        "",
        "## Source config.json (as it differs from the defaults)",
        "",
        "```json",
        json.dumps(origin["config"], indent=2, sort_keys=True, default=str),
        "```",
        "",
    ]
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m export.import_hf", description=__doc__.split("\n")[0])
    p.add_argument("checkpoint", type=Path, help="a local save_pretrained folder")
    p.add_argument("--name", required=True, help="model name in the store")
    p.add_argument("--store", type=Path, default=Path("model_store"))
    p.add_argument("--version", type=int, default=None, help="integer version (default: next free)")
    p.add_argument("--force", action="store_true", help="overwrite an existing version")
    p.add_argument("--variants", default="fp32", help="comma list of fp32,fp16,int8 (int8 needs --calibration)")
    p.add_argument("--default-variant", default="fp32")
    p.add_argument("--calibration", type=Path, default=None, help="a text file, one sentence per line (int8)")
    p.add_argument("--languages", default="", help="a one-pair translator's source,target codes, e.g. en,de")
    p.add_argument("--threads", type=int, default=2)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
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
        )
        folder = import_checkpoint(args.checkpoint, args.store, options)
    except (ImportProblem, ExportError, OSError) as exc:
        print(f"import failed: {exc}", file=sys.stderr)
        return 2
    manifest = json.loads((folder / MANIFEST).read_text())
    print(json.dumps({"folder": str(folder), "metrics": manifest["metrics"]}, indent=2))
    return 0


def _pair(value: str) -> tuple[str, str] | None:
    codes = [v.strip() for v in value.split(",") if v.strip()]
    if not codes:
        return None
    if len(codes) != 2:
        raise SystemExit(f"--languages takes source,target, got {value!r}")
    return codes[0], codes[1]


if __name__ == "__main__":
    raise SystemExit(main())
