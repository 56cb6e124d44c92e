"""Checkpoint -> validated ONNX model version folder in the model store.

Graphs (TorchScript-based exporter, opset 17, single-file models):
  classifier  model.onnx    input_ids, attention_mask (batch, sequence) int64 -> logits (batch, labels)
  translator  encoder.onnx  input_ids, attention_mask (batch, source)
                            -> last_hidden_state, cross_key_values.{i}.key/value (batch, heads, source, d_k)
              decoder.onnx  input_ids (batch, 1), encoder_attention_mask (batch, source),
                            past_key_values.{i}.key/value (batch, heads, past, d_k), cross_key_values.{i}.key/value
                            -> logprobs (batch, vocab), present.{i}.key/value (batch, heads, past+1, d_k)
The first decoder step takes an empty past (past = 0), so one decoder graph serves every step.

Nothing is written unless every check passes: ONNX Runtime vs PyTorch max abs difference ≤ 1e-4
(fp32) over several batch sizes, lengths and past lengths, and cached ONNX greedy decoding giving
exactly the tokens of uncached PyTorch decoding.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import torch
from tokenizers import Tokenizer
from torch import Tensor, nn

from export import metrics
from export.model import Classifier, Translator, greedy_uncached
from export.tokenizer import special_ids
from service.engine import pad
from service.manifest import MANIFEST, GraphSpec, Manifest, TensorSpec, file_entry

OPSET = 17
FP32_TOL = 1e-4
INT8_LOGIT_TOL = 1.0  # dynamic int8 weights: logits move, decisions mostly not; accuracy is measured
FP16_TOL = 5e-2
MAX_NEW_TOKENS = 128
DEFAULT_VARIANTS = ("fp32", "int8")


class ExportError(Exception):
    """The export would produce a model that differs from the checkpoint, or would clobber one."""


# ---------------------------------------------------------------------------------------------
# Graph wrappers: fixed IO names, flat tensor arguments
# ---------------------------------------------------------------------------------------------


def kv_names(prefix: str, n_layers: int) -> list[str]:
    return [f"{prefix}.{i}.{kind}" for i in range(n_layers) for kind in ("key", "value")]


class ClassifierGraph(nn.Module):
    def __init__(self, model: Classifier) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
        return self.model(input_ids, attention_mask)


class EncoderGraph(nn.Module):
    def __init__(self, model: Translator) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: Tensor, attention_mask: Tensor) -> tuple[Tensor, ...]:
        memory = self.model.encode(input_ids, attention_mask)
        flat = [t for kv in self.model.cross_kv(memory) for t in kv]
        return (memory, *flat)


class DecoderStepGraph(nn.Module):
    def __init__(self, model: Translator) -> None:
        super().__init__()
        self.model = model
        self.n = len(model.layers)

    def forward(self, input_ids: Tensor, encoder_attention_mask: Tensor, *kv: Tensor) -> tuple[Tensor, ...]:
        past = [(kv[2 * i], kv[2 * i + 1]) for i in range(self.n)]
        cross = [(kv[2 * self.n + 2 * i], kv[2 * self.n + 2 * i + 1]) for i in range(self.n)]
        logits, present = self.model.decode(input_ids, past, cross, encoder_attention_mask)
        # One token per row: flatten (B, 1, V), an alias in ONNX Runtime, where indexing the last position
        # became a Gather copying the logits every step (1.5% of a 128-row step).
        logprobs = torch.log_softmax(logits.flatten(0, 1), dim=-1)  # (B, V)
        return (logprobs, *[t for p in present for t in p])


def graph_io(model: Classifier | Translator) -> dict[str, GraphSpec]:
    """The documented IO contract, written into the manifest and checked against the ONNX files."""
    c = model.config
    ids = [
        TensorSpec(name="input_ids", dtype="int64", shape=["batch", "sequence"]),
        TensorSpec(name="attention_mask", dtype="int64", shape=["batch", "sequence"]),
    ]
    if isinstance(model, Classifier):
        out = [TensorSpec(name="logits", dtype="float32", shape=["batch", c.num_labels])]  # type: ignore[attr-defined]
        return {"model": GraphSpec(inputs=ids, outputs=out)}
    n, h, dk = len(model.layers), c.n_heads, c.d_model // c.n_heads

    def kv(prefix: str, length: str) -> list[TensorSpec]:
        return [TensorSpec(name=name, dtype="float32", shape=["batch", h, length, dk]) for name in kv_names(prefix, n)]

    enc_in = [
        TensorSpec(name="input_ids", dtype="int64", shape=["batch", "source"]),
        TensorSpec(name="attention_mask", dtype="int64", shape=["batch", "source"]),
    ]
    enc_out = [
        TensorSpec(name="last_hidden_state", dtype="float32", shape=["batch", "source", c.d_model]),
        *kv("cross_key_values", "source"),
    ]
    dec_in = [
        TensorSpec(name="input_ids", dtype="int64", shape=["batch", 1]),
        TensorSpec(name="encoder_attention_mask", dtype="int64", shape=["batch", "source"]),
        *kv("past_key_values", "past"),
        *kv("cross_key_values", "source"),
    ]
    dec_out = [
        TensorSpec(name="logprobs", dtype="float32", shape=["batch", c.vocab_size]),
        *kv("present", "past_plus_one"),
    ]
    return {"encoder": GraphSpec(inputs=enc_in, outputs=enc_out), "decoder": GraphSpec(inputs=dec_in, outputs=dec_out)}


def _dynamic_axes(spec: GraphSpec) -> dict[str, dict[int, str]]:
    return {t.name: {i: d for i, d in enumerate(t.shape) if isinstance(d, str)} for t in spec.inputs + spec.outputs}


def _export(module: nn.Module, args: tuple[Tensor, ...], spec: GraphSpec, path: Path) -> None:
    # The exporter restores the wrapper's training flag recursively afterwards: a wrapper left in
    # training mode would switch dropout back on in the model that validation then compares against.
    module.eval()
    torch.onnx.export(
        module,
        args,
        str(path),
        input_names=[t.name for t in spec.inputs],
        output_names=[t.name for t in spec.outputs],
        dynamic_axes=_dynamic_axes(spec),
        opset_version=OPSET,
        dynamo=False,
        do_constant_folding=True,
    )
    proto = onnx.load(str(path))
    onnx.checker.check_model(proto)
    if any(init.data_location == onnx.TensorProto.EXTERNAL for init in proto.graph.initializer):
        raise ExportError(f"{path.name}: external tensor data; the store accepts single-file models only")


def export_graphs(model: Classifier | Translator, folder: Path) -> dict[str, str]:
    """Writes the fp32 graphs; returns role -> file name."""
    model.eval()
    spec = graph_io(model)
    with torch.no_grad():
        ids = torch.tensor([[5, 6, 7, 8], [9, 10, 0, 0]])
        mask = (ids != 0).long()
        if isinstance(model, Classifier):
            _export(ClassifierGraph(model), (ids, mask), spec["model"], folder / "model.onnx")
            return {"model": "model.onnx"}
        _export(EncoderGraph(model), (ids, mask), spec["encoder"], folder / "encoder.onnx")
        cross = [t for kv in model.cross_kv(model.encode(ids, mask)) for t in kv]
        _, past = model.decode(
            torch.tensor([[1, 11, 12], [1, 13, 14]]), model.empty_past(2), model.cross_kv(model.encode(ids, mask)), mask
        )
        flat_past = [t for kv in past for t in kv]
        _export(
            DecoderStepGraph(model),
            (torch.tensor([[15], [16]]), mask, *flat_past, *cross),
            spec["decoder"],
            folder / "decoder.onnx",
        )
    return {"encoder": "encoder.onnx", "decoder": "decoder.onnx"}


# ---------------------------------------------------------------------------------------------
# Variants
# ---------------------------------------------------------------------------------------------


def make_int8(src: Path, dst: Path) -> None:
    """Dynamic int8 quantisation of the MatMul weights (activations stay float): the CPU variant."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    quantize_dynamic(str(src), str(dst), weight_type=QuantType.QInt8, per_channel=True, op_types_to_quantize=["MatMul"])


def make_fp16(src: Path, dst: Path) -> None:
    """fp16 weights and activations for the GPU variant; graph inputs and outputs stay fp32 so every
    variant shares one IO contract (the casts at the edges are cheap next to the matmuls)."""
    from onnxruntime.transformers.float16 import convert_float_to_float16

    proto = convert_float_to_float16(onnx.load(str(src)), keep_io_types=True)
    onnx.save(proto, str(dst))


# ---------------------------------------------------------------------------------------------
# ONNX Runtime helpers used by validation
# ---------------------------------------------------------------------------------------------


def session(path: Path) -> ort.InferenceSession:
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = torch.get_num_threads()
    return ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])


def ort_greedy(
    enc: ort.InferenceSession, dec: ort.InferenceSession, model: Translator, src: Sequence[Sequence[int]], max_new: int
) -> list[list[int]]:
    """A deliberately plain cached greedy loop (no beam, no row dropping): the export's own reference."""
    c = model.config
    n, h, dk = len(model.layers), c.n_heads, c.d_model // c.n_heads
    ids, mask = pad(src)
    enc_out = enc.run(None, {"input_ids": ids, "attention_mask": mask})
    cross = dict(zip(kv_names("cross_key_values", n), enc_out[1:], strict=True))
    past = {name: np.zeros((len(src), h, 0, dk), np.float32) for name in kv_names("past_key_values", n)}
    tok = np.full((len(src), 1), c.bos_id, np.int64)
    out = np.zeros((len(src), 0), np.int64)
    done = np.zeros(len(src), bool)
    for _ in range(max_new):
        res = dec.run(None, {"input_ids": tok, "encoder_attention_mask": mask, **past, **cross})
        nxt = np.where(done, c.eos_id, res[0].argmax(-1))
        out = np.concatenate([out, nxt[:, None]], axis=1)
        done |= nxt == c.eos_id
        if done.all():
            break
        past = dict(zip(kv_names("past_key_values", n), res[1:], strict=True))
        tok = nxt[:, None].astype(np.int64)
    return [row[: row.index(c.eos_id)] if c.eos_id in row else row for row in out.tolist()]


# ---------------------------------------------------------------------------------------------
# Validation
# ---------------------------------------------------------------------------------------------


def _cases(seqs: Sequence[list[int]]) -> list[list[list[int]]]:
    """Batches of sizes 1, 3 and 8 with mixed lengths (padding inside a batch), from real sentences."""
    seqs = [s for s in seqs if s] or [[5, 6, 7]]
    return [seqs[:1], seqs[1:4] or seqs[:1], seqs[4:12] or seqs[:1], [max(seqs, key=len)]]


def check_classifier(model: Classifier, path: Path, seqs: Sequence[list[int]], tol: float) -> float:
    sess = session(path)
    worst = 0.0
    for batch in _cases(seqs):
        ids, mask = pad(batch)
        ref = model(torch.from_numpy(ids), torch.from_numpy(mask)).detach().numpy()
        got = sess.run(["logits"], {"input_ids": ids, "attention_mask": mask})[0]
        worst = max(worst, float(np.abs(ref - got).max()))
    if worst > tol:
        raise ExportError(f"{path.name}: ONNX Runtime logits differ from PyTorch by {worst:.2e} > {tol:.0e}")
    return worst


def check_translator(model: Translator, enc_path: Path, dec_path: Path, seqs: Sequence[list[int]], tol: float) -> float:
    """Encoder outputs and decoder log-probs over several past lengths, including the empty past."""
    c = model.config
    n = len(model.layers)
    enc, dec = session(enc_path), session(dec_path)
    worst = 0.0
    for batch in _cases(seqs):
        ids, mask = pad(batch)
        t_ids, t_mask = torch.from_numpy(ids), torch.from_numpy(mask)
        memory = model.encode(t_ids, t_mask)
        cross_t = model.cross_kv(memory)
        ref_enc = [memory] + [t for kv in cross_t for t in kv]
        got_enc = enc.run(None, {"input_ids": ids, "attention_mask": mask})
        for r, g in zip(ref_enc, got_enc, strict=True):
            worst = max(worst, float(np.abs(r.detach().numpy() - g).max()))
        cross = dict(zip(kv_names("cross_key_values", n), got_enc[1:], strict=True))
        prefix = torch.from_numpy(np.array([[c.bos_id] + list(range(10, 16))] * len(batch), dtype=np.int64))
        for past_len in (0, 1, 4, 6):
            ref_logits, ref_past = model.decode(
                prefix[:, : past_len + 1], model.empty_past(len(batch)), cross_t, t_mask
            )
            ref = torch.log_softmax(ref_logits[:, -1], -1).detach().numpy()
            _, past = model.decode(prefix[:, :past_len], model.empty_past(len(batch)), cross_t, t_mask)
            feed = {"input_ids": prefix[:, past_len : past_len + 1].numpy(), "encoder_attention_mask": mask, **cross}
            feed.update(
                zip(kv_names("past_key_values", n), [t.detach().numpy() for kv in past for t in kv], strict=True)
            )
            got = dec.run(None, feed)
            worst = max(worst, float(np.abs(ref - got[0]).max()))
            for r, g in zip([t for kv in ref_past for t in kv], got[1:], strict=True):
                worst = max(worst, float(np.abs(r.detach().numpy() - g).max()))
    if worst > tol:
        raise ExportError(
            f"{enc_path.name}/{dec_path.name}: ONNX Runtime differs from PyTorch by {worst:.2e} > {tol:.0e}"
        )
    return worst


def check_greedy_tokens(
    model: Translator, enc_path: Path, dec_path: Path, seqs: Sequence[list[int]], max_new: int
) -> float:
    """Rate of sentences where cached ONNX greedy equals uncached PyTorch greedy, token for token."""
    enc, dec = session(enc_path), session(dec_path)
    same = 0
    for s in range(0, len(seqs), 32):
        batch = list(seqs[s : s + 32])
        ids, mask = pad(batch)
        ref = greedy_uncached(model, torch.from_numpy(ids), torch.from_numpy(mask), max_new)
        got = ort_greedy(enc, dec, model, batch, max_new)
        same += sum(a == b for a, b in zip(ref, got, strict=True))
    return same / max(1, len(seqs))


# ---------------------------------------------------------------------------------------------
# Evaluation of each variant on the test split
# ---------------------------------------------------------------------------------------------


def eval_classifier_variant(
    path: Path, tok: Tokenizer, rows: Sequence[dict], labels: Sequence[str], max_len: int
) -> dict[str, float]:
    sess = session(path)
    seqs = [e.ids[:max_len] or [special_ids()["unk_id"]] for e in tok.encode_batch([r["text"] for r in rows])]
    order = sorted(range(len(seqs)), key=lambda i: len(seqs[i]))
    pred = np.zeros(len(seqs), np.int64)
    for s in range(0, len(order), 64):
        idx = order[s : s + 64]
        ids, mask = pad([seqs[i] for i in idx])
        pred[idx] = sess.run(["logits"], {"input_ids": ids, "attention_mask": mask})[0].argmax(-1)
    gold = [labels.index(r["label"]) for r in rows]
    return {
        "accuracy": round(metrics.accuracy(gold, pred.tolist()), 4),
        "macro_f1": round(metrics.macro_f1(gold, pred.tolist(), len(labels)), 4),
    }


def eval_translator_variant(
    enc_path: Path, dec_path: Path, model: Translator, tok: Tokenizer, rows: Sequence[dict]
) -> dict[str, float]:
    enc, dec = session(enc_path), session(dec_path)
    c = model.config
    seqs = [e.ids[: c.max_len - 1] + [c.eos_id] for e in tok.encode_batch([r["en"] for r in rows])]
    order = sorted(range(len(seqs)), key=lambda i: len(seqs[i]))
    hyps = [""] * len(seqs)
    for s in range(0, len(order), 64):
        idx = order[s : s + 64]
        for i, out in zip(idx, ort_greedy(enc, dec, model, [seqs[i] for i in idx], c.max_len), strict=True):
            hyps[i] = tok.decode(out)
    return metrics.bleu_chrf(hyps, [r["de"] for r in rows])


# ---------------------------------------------------------------------------------------------
# The store
# ---------------------------------------------------------------------------------------------


def next_version(store: Path, name: str) -> int:
    folder = store / name
    versions = [int(p.name) for p in folder.iterdir() if p.name.isdigit()] if folder.is_dir() else []
    return max(versions, default=0) + 1


def export_model(
    model: Classifier | Translator,
    tok: Tokenizer,
    store: Path,
    name: str,
    version: int | None = None,
    force: bool = False,
    variants: Sequence[str] = DEFAULT_VARIANTS,
    default_variant: str = "fp32",
    ship: Sequence[str] | None = None,
    validation_texts: Sequence[str] = (),
    test_rows: Sequence[dict] = (),
    labels: Sequence[str] = (),
    train_metrics: dict | None = None,
    data_sources: Sequence[dict[str, str]] = (),
    min_parity_sentences: int = 100,
    log: Callable[[str], None] = print,
) -> Path:
    """Export, validate, measure and publish one model version; returns its folder."""
    if "fp32" not in variants:
        raise ExportError("the fp32 variant is the reference for every other and must be exported")
    ship = list(ship or variants)
    if not set(ship) <= set(variants) or default_variant not in ship:
        raise ExportError(
            f"shipped variants {ship} must be exported ({list(variants)}) and include {default_variant!r}"
        )
    version = version or next_version(store, name)
    final = store / name / str(version)
    if final.exists() and not force:
        raise ExportError(f"{final} exists; pass --force to overwrite it")
    model = model.eval().cpu()
    is_clf = isinstance(model, Classifier)
    c = model.config
    max_src = c.max_len if is_clf else c.max_len - 1
    seqs = [e.ids[:max_src] for e in tok.encode_batch(list(validation_texts))] if validation_texts else []
    if not is_clf:
        seqs = [s + [c.eos_id] for s in seqs]  # type: ignore[attr-defined]
    report: dict[str, object] = {"train": train_metrics or {}}
    t0 = time.perf_counter()
    store.mkdir(parents=True, exist_ok=True)
    # Built in a hidden folder of the store, then renamed into place: a failed or interrupted
    # export never leaves a half-written version behind.
    tmp = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=store))
    try:
        files: dict[str, dict[str, str]] = {"fp32": export_graphs(model, tmp)}
        with torch.no_grad():
            if is_clf:
                report["fp32_max_abs_diff"] = check_classifier(model, tmp / "model.onnx", seqs, FP32_TOL)
            else:
                report["fp32_max_abs_diff"] = check_translator(
                    model, tmp / "encoder.onnx", tmp / "decoder.onnx", seqs, FP32_TOL
                )
                parity = seqs[: max(min_parity_sentences, 100)]
                if len(parity) < min_parity_sentences:
                    raise ExportError(
                        f"token parity needs at least {min_parity_sentences} validation sentences, got {len(parity)}"
                    )
                rate = check_greedy_tokens(
                    model, tmp / "encoder.onnx", tmp / "decoder.onnx", parity, min(MAX_NEW_TOKENS, c.max_len)
                )
                report["greedy_identical_rate"] = rate
                report["greedy_parity_sentences"] = len(parity)
                if rate < 1.0:
                    raise ExportError(
                        f"cached ONNX greedy differs from PyTorch on {1 - rate:.1%} of {len(parity)} sentences"
                    )
            for variant in variants:
                if variant == "fp32":
                    continue
                make = {"int8": make_int8, "fp16": make_fp16}.get(variant)
                if make is None:
                    raise ExportError(f"unknown variant {variant!r} (choose from fp32, int8, fp16)")
                files[variant] = {}
                for role, fname in files["fp32"].items():
                    out = fname.replace(".onnx", f".{variant}.onnx")
                    make(tmp / fname, tmp / out)
                    files[variant][role] = out
                tol = INT8_LOGIT_TOL if variant == "int8" else FP16_TOL
                if is_clf:
                    report[f"{variant}_max_abs_diff"] = check_classifier(
                        model, tmp / files[variant]["model"], seqs, tol
                    )
                else:
                    report[f"{variant}_max_abs_diff"] = check_translator(
                        model, tmp / files[variant]["encoder"], tmp / files[variant]["decoder"], seqs[:16], tol
                    )
        report["export_seconds"] = round(time.perf_counter() - t0, 1)
        if test_rows:
            for variant, roles in files.items():
                t1 = time.perf_counter()
                if is_clf:
                    report[f"test_{variant}"] = eval_classifier_variant(
                        tmp / roles["model"], tok, test_rows, labels, c.max_len
                    )
                else:
                    report[f"test_{variant}_greedy"] = eval_translator_variant(
                        tmp / roles["encoder"], tmp / roles["decoder"], model, tok, test_rows
                    )
                result = report.get(f"test_{variant}") or report.get(f"test_{variant}_greedy")
                log(f"{name}: {variant} on the test split {result} ({time.perf_counter() - t1:.0f}s)")
        # Variants measured but not shipped (to keep a bundled store small) leave no files behind;
        # their parity and test figures stay in the manifest's metrics.
        for variant in [v for v in files if v not in ship]:
            for fname in files.pop(variant).values():
                (tmp / fname).unlink()
        report["shipped_variants"] = list(files)
        tok.save(str(tmp / "tokenizer.json"))
        all_files = sorted(p.name for p in tmp.iterdir())
        manifest = Manifest(
            name=name,
            version=version,
            task="classification" if is_clf else "translation",
            created=datetime.now(UTC).isoformat(timespec="seconds"),
            architecture={k: v for k, v in asdict(c).items()},
            opset=OPSET,
            graphs=graph_io(model),
            variants=files,
            default_variant=default_variant,
            output="logits" if is_clf else "logprobs",
            tokenizer="tokenizer.json",
            special_tokens=special_ids(),
            labels=list(labels),
            max_source_tokens=max_src,
            max_new_tokens=0 if is_clf else c.max_len,
            metrics=report,
            data_sources=list(data_sources),
            files={f: file_entry(tmp / f) for f in all_files},
        )
        # The manifest is written last: a folder without one is never served.
        (tmp / MANIFEST).write_text(manifest.model_dump_json(indent=2) + "\n")
        if final.exists():
            shutil.rmtree(final)
        final.parent.mkdir(parents=True, exist_ok=True)
        tmp.chmod(0o755)
        tmp.rename(final)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final


def data_sources_of(card: Path, dataset: str) -> list[dict[str, str]]:
    """Package, version and licence of every source of one dataset, from the data build's card."""
    if not card.is_file():
        raise ExportError(f"{card} not found: run `make data` first (the manifest records the data sources)")
    sources = json.loads(card.read_text()).get(dataset, {}).get("sources", [])
    return [{"package": s["name"], "version": s["version"], "license": s.get("licence", "")} for s in sources]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m export.onnx", description="Export a trained checkpoint into the model store."
    )
    p.add_argument("checkpoint", type=Path, help="folder with model.safetensors, config.json, tokenizer.json")
    p.add_argument("--name", required=True, help="model name in the store, e.g. sentiment or en-de")
    p.add_argument("--store", type=Path, default=Path("model_store"))
    p.add_argument("--version", type=int, default=None, help="integer version (default: next free)")
    p.add_argument("--force", action="store_true", help="overwrite an existing version")
    p.add_argument("--variants", default=",".join(DEFAULT_VARIANTS), help="comma list of fp32,int8,fp16")
    p.add_argument("--default-variant", default="fp32", help="the variant served unless SERVE_VARIANT says otherwise")
    p.add_argument("--ship", default="", help="variants written to the store (default: all exported)")
    p.add_argument("--data-dir", type=Path, default=Path("data"), help="validation and test sentences come from here")
    p.add_argument("--threads", type=int, default=2)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    from export.data import SENTIMENT_LABELS, load_jsonl
    from export.train import load_checkpoint

    args = build_parser().parse_args(argv)
    torch.set_num_threads(args.threads)
    try:
        model, tok = load_checkpoint(args.checkpoint)
        is_clf = isinstance(model, Classifier)
        sub = "sentiment" if is_clf else "translation"
        test_file = args.data_dir / sub / "test.jsonl"
        if not test_file.is_file():
            raise ExportError(f"{test_file} not found: run `make data` first (validation uses real sentences)")
        test_rows = load_jsonl(test_file)
        texts = [r["text"] if is_clf else r["en"] for r in test_rows]
        report_file = args.checkpoint / "report.json"
        train_report = json.loads(report_file.read_text()) if report_file.is_file() else {}
        train_metrics = {k: v for k, v in train_report.items() if k not in ("curves", "examples", "args")}
        sources = data_sources_of(args.data_dir / "datacard.json", sub)
        folder = export_model(
            model,
            tok,
            args.store,
            args.name,
            args.version,
            args.force,
            variants=[v.strip() for v in args.variants.split(",") if v.strip()],
            default_variant=args.default_variant,
            ship=[v.strip() for v in args.ship.split(",") if v.strip()] if args.ship else None,
            validation_texts=texts[:200],
            test_rows=test_rows,
            labels=SENTIMENT_LABELS if is_clf else (),
            train_metrics=train_metrics,
            data_sources=sources,
        )
    except (ExportError, FileNotFoundError, ValueError) as exc:
        print(f"export failed: {exc}", file=sys.stderr)
        return 1
    manifest = json.loads((folder / MANIFEST).read_text())
    print(json.dumps({"folder": str(folder), "files": manifest["files"], "metrics": manifest["metrics"]}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
