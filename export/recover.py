"""Recover a trainable checkpoint (translator or classifier) from a published version's float graphs.

A store ships int8 and fp16 graphs, not the PyTorch weights of its run; training a published model
further (`export.train translator --init RUN`) or publishing it again (with a newer exporter:
`export.publish RUN`) needs them back. The run folder also gets the version's training report and
curves, so a re-published manifest keeps the figures of the training it came from.

The exporter keeps a parameter's name where the graph uses it as is and names a transposed matmul
weight after its node (`/encoder/layers.0/attn/q_proj/MatMul`, `/q_proj_1/MatMul`), so every
weight is found by the node that reads it. fp16 graphs give the weights rounded to fp16; int8
graphs are refused (their weights are not the model's).

    python -m export.recover model_store/en-de/1 --out runs/en-de-recovered [--variant fp16]
    python -m export.recover model_store/sentiment/1 --out runs/sentiment-recovered
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import onnx
import torch
from onnx import numpy_helper
from safetensors.torch import save_file

from export.cli import HelpFormatter
from export.model import Classifier, ClassifierConfig, Translator, TranslatorConfig, save_config

_ENCODER_PROJ = re.compile(r"^/encoder/layers\.(\d+)/(?:attn/)?(q_proj|k_proj|v_proj|out_proj)/MatMul$")
_ENCODER_FFN = re.compile(r"^/encoder/layers\.(\d+)/ffn/(fc1|fc2)/MatMul$")
_CROSS_KV = re.compile(r"^/(k_proj|v_proj)(?:_(\d+))?/MatMul$")
_DECODER_FFN = re.compile(r"^/ffn/(fc1|fc2)(?:_(\d+))?/MatMul$")
_CROSS_Q = re.compile(r"^/q_proj(?:_(\d+))?/MatMul$")
_OUT_PROJ = re.compile(r"^/out_proj(?:_\d+)?/MatMul$")
_CLASSIFIER_MATMUL = re.compile(r"^/layers\.(\d+)/(attn/|ffn/)?(q_proj|k_proj|v_proj|out_proj|fc1|fc2)/MatMul$")


class RecoverError(ValueError):
    """The graphs are not a float model of this project's export."""


def _weights(graph: onnx.GraphProto) -> dict[str, np.ndarray]:
    return {t.name: numpy_helper.to_array(t).astype(np.float32) for t in graph.initializer}


def _named(weights: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Initializers the exporter kept under their parameter name (`model.` is the wrapper's)."""
    return {k.removeprefix("model."): v for k, v in weights.items() if k.startswith("model.")}


def _weight_matmuls(graph: onnx.GraphProto) -> tuple[dict[str, np.ndarray], list[tuple[str, np.ndarray]]]:
    """The parameters kept under their names, and each MatMul that reads a weight: (node name, weight)."""
    weights = _weights(graph)
    matmuls = [
        (node.name, w)
        for node in graph.node
        if node.op_type == "MatMul"
        and (w := next((weights[x] for x in node.input if x.startswith("onnx::") and x in weights), None)) is not None
    ]
    return _named(weights), matmuls


def encoder_weights(graph: onnx.GraphProto) -> dict[str, np.ndarray]:
    """Parameters read off the encoder graph: the encoder's and the decoder's cross-attention keys
    and values (which the encoder graph computes once per source)."""
    out, matmuls = _weight_matmuls(graph)
    for name, w in matmuls:
        if m := _ENCODER_PROJ.match(name):
            out[f"encoder.layers.{m[1]}.attn.{m[2]}.weight"] = w.T
        elif m := _ENCODER_FFN.match(name):
            out[f"encoder.layers.{m[1]}.ffn.{m[2]}.weight"] = w.T
        elif m := _CROSS_KV.match(name):
            out[f"layers.{m[2] or 0}.cross_attn.{m[1]}.weight"] = w.T
        else:
            raise RecoverError(f"encoder graph: a matmul weight at {name!r} this recovery does not know")
    return out


def decoder_weights(graph: onnx.GraphProto) -> dict[str, np.ndarray]:
    """Parameters read off the decoder-step graph. Its scopes carry no layer number: the n-th
    occurrence of a projection in graph order is layer n's; the self-attention's q, k, v are one
    fused matmul and bias, and its output projection is the one reading the attention operator."""
    weights = _weights(graph)
    out = _named(weights)
    produced_by = {o: n for n in graph.node for o in n.output}
    fused = out_self = out_cross = 0
    for node in graph.node:
        w = next((weights[x] for x in node.input if x.startswith("onnx::") and x in weights), None)
        if w is None or node.op_type != "MatMul":
            continue  # (the fused bias is an Add's: taken with its matmul below)
        d = w.shape[0]
        if w.shape[1] == 3 * d:
            layer = f"layers.{fused}.self_attn"
            add = next((n for n in graph.node if n.op_type == "Add" and node.output[0] in n.input), None)
            bias = next((weights[x] for x in add.input if x in weights), None) if add is not None else None
            if bias is None:
                raise RecoverError(f"decoder graph: the fused projection {node.name!r} has no bias")
            for i, proj in enumerate(("q_proj", "k_proj", "v_proj")):
                out[f"{layer}.{proj}.weight"] = w[:, i * d : (i + 1) * d].T
                out[f"{layer}.{proj}.bias"] = bias[i * d : (i + 1) * d]
            fused += 1
        elif _OUT_PROJ.match(node.name):
            source = produced_by.get(node.input[0])
            if source is not None and source.op_type == "GroupQueryAttention":
                out[f"layers.{out_self}.self_attn.out_proj.weight"] = w.T
                out_self += 1
            else:
                out[f"layers.{out_cross}.cross_attn.out_proj.weight"] = w.T
                out_cross += 1
        elif m := _CROSS_Q.match(node.name):
            out[f"layers.{m[1] or 0}.cross_attn.q_proj.weight"] = w.T
        elif m := _DECODER_FFN.match(node.name):
            out[f"layers.{m[2] or 0}.ffn.{m[1]}.weight"] = w.T
        elif w.shape[1] != d:  # the tied output projection: the token embedding, transposed
            out["output_projection"] = w.T
        else:
            raise RecoverError(f"decoder graph: a matmul weight at {node.name!r} this recovery does not know")
    return out


def _architecture(version_dir: Path, variant: str, task: str) -> dict[str, int | float | str]:
    """The version's architecture, once its variant and task are ones this recovery reads."""
    if variant == "int8":
        raise RecoverError("int8 graphs hold quantised weights, not the model's: recover from fp16 or fp32")
    manifest = json.loads((version_dir / "manifest.json").read_text())
    if manifest.get("task") != task:
        raise RecoverError(f"{version_dir}: not a {task} model")
    arch: dict[str, int | float | str] = manifest["architecture"]
    return arch


def recover_translator(version_dir: Path, variant: str = "fp16") -> Translator:
    """The translator whose `variant` graphs a store version holds, as a PyTorch model."""
    arch = _architecture(version_dir, variant, "translation")
    config = TranslatorConfig(**{k: arch[k] for k in TranslatorConfig.__dataclass_fields__ if k in arch})
    suffix = "" if variant == "fp32" else f".{variant}"
    paths = {role: version_dir / f"{role}{suffix}.onnx" for role in ("encoder", "decoder")}
    for path in paths.values():
        if not path.is_file():
            raise RecoverError(f"{path} is missing: the version does not ship the {variant} graphs")
    enc = encoder_weights(onnx.load(str(paths["encoder"])).graph)
    dec = decoder_weights(onnx.load(str(paths["decoder"])).graph)
    for key in set(enc) & set(dec):
        if not np.array_equal(enc[key], dec[key]):
            raise RecoverError(f"{key} differs between the encoder and decoder graphs")
    found = {**enc, **dec}
    projection = found.pop("output_projection", None)
    if projection is not None and not np.allclose(projection, found["embed.tokens.weight"], atol=1e-3):
        raise RecoverError("the output projection is not the token embedding: not a tied translator")
    model = Translator(config)
    _load(model, found)
    return model.eval()


def classifier_weights(graph: onnx.GraphProto) -> dict[str, np.ndarray]:
    """Parameters read off a classifier graph: named ones as they are, each matmul weight by the
    layer and projection its node's scope names (`/layers.2/ffn/fc2/MatMul`)."""
    out, matmuls = _weight_matmuls(graph)
    for name, w in matmuls:
        if not (m := _CLASSIFIER_MATMUL.match(name)):
            raise RecoverError(f"classifier graph: a matmul weight at {name!r} this recovery does not know")
        part = "ffn" if m[3].startswith("fc") else "attn"
        out[f"encoder.layers.{m[1]}.{part}.{m[3]}.weight"] = w.T
    return out


def _shared(model: Classifier | Translator, key: str) -> bool:
    """A translator's encoder embedding is its shared one: neither read back nor saved on its own."""
    return isinstance(model, Translator) and key.startswith("encoder.embed.")


def _load(model: Classifier | Translator, found: dict[str, np.ndarray]) -> None:
    """Every parameter found, with its shape."""
    state = model.state_dict()
    missing = sorted(k for k in state if k not in found and not _shared(model, k))
    extra = sorted(set(found) - set(state))
    if missing or extra:
        raise RecoverError(f"weights missing {missing[:4]} or unknown {extra[:4]}")
    for key, value in found.items():
        if tuple(state[key].shape) != value.shape:
            raise RecoverError(f"{key}: shape {value.shape} in the graph, {tuple(state[key].shape)} in the model")
    model.load_state_dict({k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in found.items()}, strict=False)


def recover_classifier(version_dir: Path, variant: str = "fp16") -> Classifier:
    """The classifier whose `variant` graph a store version holds, as a PyTorch model (its head
    with the fitted temperature folded in, as it was exported)."""
    arch = _architecture(version_dir, variant, "classification")
    config = ClassifierConfig(**{k: arch[k] for k in ClassifierConfig.__dataclass_fields__ if k in arch})
    path = version_dir / ("model.onnx" if variant == "fp32" else f"model.{variant}.onnx")
    if not path.is_file():
        raise RecoverError(f"{path} is missing: the version does not ship the {variant} graph")
    model = Classifier(config)
    _load(model, classifier_weights(onnx.load(str(path)).graph))
    return model.eval()


def recover(version_dir: Path, variant: str = "fp16") -> Classifier | Translator:
    """The model of a store version, whichever task it serves (another task: refused)."""
    task = json.loads((version_dir / "manifest.json").read_text()).get("task")
    return (
        recover_classifier(version_dir, variant)
        if task == "classification"
        else recover_translator(version_dir, variant)
    )


def write_run(model: Classifier | Translator, version_dir: Path, out: Path) -> None:
    """A run folder as `export.train` leaves it (weights, config, tokenizer, report, curves), for
    `--init` or `export.publish`."""
    out.mkdir(parents=True, exist_ok=True)
    state = {k: v.contiguous() for k, v in model.state_dict().items() if not _shared(model, k)}
    save_file(state, str(out / "model.safetensors"))
    save_config(model.config, out / "config.json")
    shutil.copyfile(version_dir / "tokenizer.json", out / "tokenizer.json")
    manifest = json.loads((version_dir / "manifest.json").read_text())
    report = dict(manifest.get("metrics", {}).get("train", {}))
    if manifest.get("span_rules", 1) != report.get("span_rules", 1):  # what export.publish reads it from
        report["span_rules"] = manifest["span_rules"]
    (out / "report.json").write_text(json.dumps(report, indent=1) + "\n")
    if (version_dir / "curves.png").is_file():
        shutil.copyfile(version_dir / "curves.png", out / "curves.png")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m export.recover", description=(__doc__ or "").split("\n")[0], formatter_class=HelpFormatter
    )
    p.add_argument("version_dir", type=Path, help="a store version folder, e.g. model_store/en-de/1")
    p.add_argument("--out", type=Path, required=True, help="the run folder to write (required)")
    p.add_argument("--variant", default="fp16", choices=("fp32", "fp16"), help="the graph the weights are read from")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        model = recover(args.version_dir, args.variant)
    except (RecoverError, FileNotFoundError, KeyError) as exc:
        print(f"recover failed: {exc}", file=sys.stderr)
        return 1
    write_run(model, args.version_dir, args.out)
    print(f"{args.out}: {sum(p.numel() for p in model.parameters())} parameters from {args.variant}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
