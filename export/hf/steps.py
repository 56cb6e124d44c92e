"""An imported translator's step model as the contract's graphs, checked against transformers.

Any family's step model (`export.hf.seq2seq.Seq2Seq` for the BART lineage) is written and checked
here through `ImportedStep`: the graphs and the check read its dimensions and its steps, never its
family.
"""

from __future__ import annotations

from collections.abc import Sized
from pathlib import Path
from typing import Protocol

import numpy as np
import onnx
import onnxruntime as ort
import torch
from torch import Tensor, nn

from export.graphs import DecoderStepGraph, EncoderGraph, export_graph, translator_io
from export.validate import ExportError, session
from service.contract import graphs as io
from service.contract.graphs import pad

KV = tuple[Tensor, Tensor]
FP16_MAX = float(np.finfo(np.float16).max)  # 65504


class ImportedDims(Protocol):
    """What the exporter's validation reads of an imported translator's dimensions and ids."""

    @property
    def n_heads(self) -> int: ...
    @property
    def d_model(self) -> int: ...
    @property
    def d_k(self) -> int: ...
    @property
    def vocab_size(self) -> int: ...
    @property
    def bos_id(self) -> int: ...
    @property
    def eos_id(self) -> int: ...
    @property
    def pad_id(self) -> int: ...
    @property
    def max_len(self) -> int: ...


class ImportedStep(Protocol):
    """An imported translator's step model (`export.graphs.StepModel` and what the checks read):
    log-probabilities from `decode_step`, the suppressed ids' mask, an empty cache."""

    @property
    def config(self) -> ImportedDims: ...
    @property
    def layers(self) -> Sized: ...
    @property
    def suppress(self) -> Tensor:
        """(V,) 0 or -inf: -inf where an id is never generated."""
        ...

    def eval(self) -> nn.Module: ...

    def encode(self, ids: Tensor, mask: Tensor) -> Tensor: ...

    def cross_kv(self, memory: Tensor) -> list[KV]: ...

    def decode_step(
        self,
        tokens: Tensor,
        positions: Tensor,
        cache: list[KV],
        cross: list[KV],
        src_mask: Tensor,
        in_place: bool = False,
        folding: tuple[Tensor, Tensor] | None = None,
    ) -> tuple[Tensor, list[KV], Tensor]: ...

    def empty_cache(self, rows: int, slots: int) -> list[KV]: ...

    def mismatch_hint(self, targets: Tensor) -> str:
        """Why transformers' greedy `targets` may decode otherwise than the engine, or ""."""
        ...


def export_translator(model: ImportedStep, folder: Path) -> dict[str, str]:
    """Writes the fp32 encoder and decoder-step graphs; returns role -> file name."""
    model.eval()
    spec = translator_io(model)
    with torch.no_grad():
        ids = torch.tensor([[5, 6, 7, 8], [9, 10, 11, model.config.pad_id]])
        mask = torch.tensor([[1, 1, 1, 1], [1, 1, 1, 0]])
        export_graph(EncoderGraph(model), (ids, mask), spec["encoder"], folder / "encoder.onnx")
        cross = [t for kv in model.cross_kv(model.encode(ids, mask)) for t in kv]
        cache = [t for kv in model.empty_cache(3, 5) for t in kv]  # the first sentence in two rows, the second in one
        fold, unfold = (torch.from_numpy(a) for a in io.fold_indices([0, 2], [2, 1]))
        args = (torch.tensor([[12], [14], [13]]), torch.tensor([3, 3, 1]), mask, fold, unfold, *cache, *cross)
        export_graph(
            DecoderStepGraph(model, normalised=True), args, spec["decoder"], folder / "decoder.onnx", contrib=True
        )
    return {"encoder": "encoder.onnx", "decoder": "decoder.onnx"}


def greedy_targets(hf: nn.Module, model: ImportedStep, sources: list[list[int]]) -> tuple[np.ndarray, ...]:
    """Padded `sources` (ids, mask) and transformers' own greedy targets for them (decoder start +
    generated, each row as long as the longest): the positions decoding visits."""
    ids, mask = pad(sources, model.config.pad_id)
    steps = min(12, model.config.max_len - 1)  # a short position table ends before
    with torch.no_grad():
        out = hf.generate(
            input_ids=torch.from_numpy(ids),
            attention_mask=torch.from_numpy(mask),
            num_beams=1,
            do_sample=False,
            max_new_tokens=steps,
            min_new_tokens=steps,
        )
    return ids, mask, out[:, :steps].numpy()


def teacher_forced(
    model: ImportedStep,
    folder: Path,
    roles: dict[str, str],
    ids: np.ndarray,
    mask: np.ndarray,
    tgt: np.ndarray,
    record: list[dict[str, np.ndarray]] | None = None,
) -> np.ndarray:
    """The ONNX graphs' log-probabilities (rows, steps, V) of each next target token, every row of one
    running batch at its own position: row r joins at step r, so the cache holds rows of different
    lengths and spare slots with junk. `record`: each decoder step's feed is appended to it."""
    c = model.config
    enc, dec = session(folder / roles["encoder"]), session(folder / roles["decoder"])
    n, (rows, steps) = len(model.layers), tgt.shape
    cross = enc.run(io.cross_names(n), {io.INPUT_IDS: ids, io.ATTENTION_MASK: mask})
    slots = steps + rows
    junk = np.random.default_rng(0)
    cache = [junk.normal(size=(rows, c.n_heads, slots, c.d_k)).astype(np.float32) for _ in range(2 * n)]
    out = np.zeros((rows, steps, c.vocab_size), np.float32)
    for step in range(steps + rows - 1):
        active = [r for r in range(rows) if 0 <= step - r < steps]
        pos = np.array([step - r for r in active], dtype=np.int64)
        fold, unfold = io.per_row_folding(len(active))
        feed = {
            io.INPUT_IDS: tgt[active, pos][:, None],
            io.POSITION_IDS: pos,
            io.ENCODER_ATTENTION_MASK: mask[active],
            io.FOLD: fold,
            io.UNFOLD: unfold,
            **dict(zip(io.cache_names(n), [b[active] for b in cache], strict=True)),
            **dict(zip(io.cross_names(n), [x[active] for x in cross], strict=True)),
        }
        if record is not None:
            record.append(feed)
        res = dec.run(None, feed)
        out[active, pos] = res[0]
        for j, new in enumerate(io.new_kv_from_present(res[1 : 1 + 2 * n], pos)):
            cache[j][active, :, pos] = new[:, :, 0]
    return out


def activation_peak(path: Path, feeds: list[dict[str, np.ndarray]]) -> float:
    """The largest finite magnitude any product, power or float multiplication reaches inside the graph
    at `path` on `feeds` (each such node's output made a graph output). Sums are left out: the masks'
    -1e9 is added, never multiplied, and a residual sum past the range shows in its norm's square."""
    proto = onnx.shape_inference.infer_shapes(onnx.load(str(path)))  # types stop at the contrib op
    floats = {v.name for v in proto.graph.value_info if v.type.tensor_type.elem_type == onnx.TensorProto.FLOAT}
    known = {o.name for o in proto.graph.output}
    names = [
        o
        for n in proto.graph.node
        for o in n.output
        if o not in known and (n.op_type in ("MatMul", "Gemm", "Pow") or (n.op_type == "Mul" and o in floats))
    ]
    proto.graph.output.extend(onnx.helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, None) for name in names)
    probe = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    peak = 0.0
    for feed in feeds:
        for value in probe.run(None, feed):
            if value.dtype == np.float32 and value.size:
                finite = value[np.isfinite(value)]
                peak = max(peak, float(np.abs(finite).max()) if finite.size else 0.0)
    return peak


def check_against_transformers(
    hf: nn.Module, model: ImportedStep, folder: Path, roles: dict[str, str], sources: list[list[int]], tol: float
) -> dict[str, object]:
    """Teacher-forced log-probabilities of the ONNX graphs (`teacher_forced`) against transformers'
    forward on transformers' own greedy targets. Returns the figures; raises ExportError."""
    ids, mask, tgt = greedy_targets(hf, model, sources)
    with torch.no_grad():
        logits = hf(
            input_ids=torch.from_numpy(ids),
            attention_mask=torch.from_numpy(mask),
            decoder_input_ids=torch.from_numpy(tgt),
        ).logits
    ref = torch.log_softmax(logits, -1).numpy()
    got = teacher_forced(model, folder, roles, ids, mask, tgt)
    live = ~np.isneginf(model.suppress.numpy())
    worst = float(np.abs(got[..., live] - ref[..., live]).max())
    if worst > tol:
        why = model.mismatch_hint(torch.from_numpy(tgt))
        raise ExportError(f"decoder log-probabilities differ from transformers by {worst:.2e} > {tol:.0e}{why}")
    return {"transformers_max_abs_diff": worst, "parity_sentences": len(sources), "parity_steps": tgt.shape[1]}


def check_variant_against_fp32(
    hf: nn.Module,
    model: ImportedStep,
    folder: Path,
    files: dict[str, dict[str, str]],
    variant: str,
    sources: list[list[int]],
    tol: float,
) -> dict[str, object]:
    """A variant's whole graphs (its own encoder, its own cache) against the fp32 graphs on the same
    teacher-forced targets, as next-token probabilities: a variant whose activations overflow
    (fp16 in T5 1.1's feed-forward: NaN or inf) or drift past `tol` raises ExportError. fp16 is also
    held to its range: ONNX Runtime's CPU runs most fp16 operators in fp32 (an overflow would only
    show on a GPU), so any activation of the fp32 graphs on these inputs past fp16's largest value
    refuses it."""
    ids, mask, tgt = greedy_targets(hf, model, sources)
    feeds: list[dict[str, np.ndarray]] = []
    ref = np.exp(teacher_forced(model, folder, files["fp32"], ids, mask, tgt, feeds))
    if variant == "fp16":
        fp32 = files["fp32"]
        peak = max(
            activation_peak(folder / fp32["encoder"], [{io.INPUT_IDS: ids, io.ATTENTION_MASK: mask}]),
            activation_peak(folder / fp32["decoder"], feeds),
        )
        if peak > FP16_MAX:
            raise ExportError(
                f"fp16: an activation reaches {peak:.3g} in the fp32 graphs, past fp16's largest value {FP16_MAX:.0f}: "
                "it would overflow (publish fp32, or int8 for CPUs)"
            )
    got = np.exp(teacher_forced(model, folder, files[variant], ids, mask, tgt))
    if not np.isfinite(got).all():
        raise ExportError(f"{variant}: the graphs give NaN or inf where fp32 does not (an activation overflows)")
    worst = float(np.abs(got - ref).max())
    if worst > tol:
        raise ExportError(f"{variant}: next-token probabilities differ from fp32 by {worst:.2e} > {tol:.0e}")
    return {f"{variant}_max_abs_diff": worst}
