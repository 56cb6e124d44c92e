"""PyTorch modules as ONNX graphs with the contract's fixed IO names (`service.contract.graphs`).

TorchScript-based exporter, opset 17 (and ONNX Runtime's contrib domain for the decoder's fused
self-attention, `export.fused`), single-file models. The translator's first decoder step takes a
cache with no used slot (position 0), so one decoder graph serves every step.
"""

from __future__ import annotations

from collections.abc import Sized
from pathlib import Path
from typing import Protocol

import onnx
import torch
from torch import Tensor, nn

from export.fused import CONTRIB_DOMAIN, CONTRIB_OPSET
from export.model import Classifier, Translator
from export.validate import ExportError
from service.contract import graphs as io
from service.contract.manifest import GraphSpec, TensorSpec

OPSET = 17


class StepDims(Protocol):
    """The dimensions a translator's graphs are declared with."""

    @property
    def n_heads(self) -> int: ...
    @property
    def d_model(self) -> int: ...
    @property
    def d_k(self) -> int:
        """Each attention head's width (d_model / n_heads, except where T5's d_kv says otherwise)."""
        ...

    @property
    def vocab_size(self) -> int: ...


class StepModel(Protocol):
    """What the translator graphs see of a model: its dimensions, its decoder layers (counted),
    the encoder and one decoder step. The bundled `export.model.Translator` and every imported
    family's step model (`export.hf.seq2seq.Seq2Seq`) are one; no graph code names a family."""

    @property
    def config(self) -> StepDims: ...
    @property
    def layers(self) -> Sized: ...

    def encode(self, ids: Tensor, mask: Tensor) -> Tensor:
        """(B, S) ids and mask -> (B, S, D)."""
        ...

    def cross_kv(self, memory: Tensor) -> list[tuple[Tensor, Tensor]]:
        """Cross-attention K/V per decoder layer, (B, H, S, d_k) each."""
        ...

    def decode_step(
        self,
        tokens: Tensor,
        positions: Tensor,
        cache: list[tuple[Tensor, Tensor]],
        cross: list[tuple[Tensor, Tensor]],
        src_mask: Tensor,
        in_place: bool = False,
        folding: tuple[Tensor, Tensor] | None = None,
    ) -> tuple[Tensor, list[tuple[Tensor, Tensor]], Tensor]:
        """One token per row at its own position: scores (R, V), the cache, cross-attention weights."""
        ...


class ClassifierGraph(nn.Module):
    def __init__(self, model: Classifier) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: Tensor, attention_mask: Tensor) -> tuple[Tensor, Tensor]:
        return self.model.with_attention(input_ids, attention_mask)


class EncoderGraph(nn.Module):
    def __init__(self, model: StepModel) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: Tensor, attention_mask: Tensor) -> tuple[Tensor, ...]:
        memory = self.model.encode(input_ids, attention_mask)
        flat = [t for kv in self.model.cross_kv(memory) for t in kv]
        return (memory, *flat)


class DecoderStepGraph(nn.Module):
    """The decoder step as the contract's graph. `normalised`: the model's `decode_step` returns
    log-probabilities already (an imported model's suppressed ids at -inf must not be
    renormalised away by another log-softmax)."""

    def __init__(self, model: StepModel, normalised: bool = False) -> None:
        super().__init__()
        self.model, self.normalised = model, normalised
        self.n = len(model.layers)

    def forward(
        self,
        input_ids: Tensor,
        position_ids: Tensor,
        encoder_attention_mask: Tensor,
        fold: Tensor,
        unfold: Tensor,
        *kv: Tensor,
    ) -> tuple[Tensor, ...]:
        cache = [(kv[2 * i], kv[2 * i + 1]) for i in range(self.n)]
        cross = [(kv[2 * self.n + 2 * i], kv[2 * self.n + 2 * i + 1]) for i in range(self.n)]
        logits, present, weights = self.model.decode_step(
            input_ids, position_ids, cache, cross, encoder_attention_mask, in_place=True, folding=(fold, unfold)
        )
        logprobs = logits if self.normalised else torch.log_softmax(logits, dim=-1)  # (R, V)
        return (logprobs, *[t for kv_ in present for t in kv_], weights)


def classifier_io(model: Classifier) -> dict[str, GraphSpec]:
    """The classifier's documented IO contract, written into the manifest and checked against the ONNX file."""
    c = model.config
    ids = [
        TensorSpec(name=io.INPUT_IDS, dtype="int64", shape=["batch", "sequence"]),
        TensorSpec(name=io.ATTENTION_MASK, dtype="int64", shape=["batch", "sequence"]),
    ]
    out = [
        TensorSpec(name=io.LOGITS, dtype="float32", shape=["batch", c.num_labels]),
        TensorSpec(name=io.ATTENTIONS, dtype="float32", shape=["batch", c.n_heads, "sequence", "sequence"]),
    ]
    return {"model": GraphSpec(inputs=ids, outputs=out)}


def translator_io(model: StepModel) -> dict[str, GraphSpec]:
    """The encoder's and the decoder step's documented IO contract, from what any translator states
    of itself (`config` and its decoder `layers`): the bundled one and an imported one alike."""
    c = model.config
    n, h, dk = len(model.layers), c.n_heads, c.d_k

    def kv(names: list[str], length: str | int, rows: str = "batch") -> list[TensorSpec]:
        return [TensorSpec(name=name, dtype="float32", shape=[rows, h, length, dk]) for name in names]

    enc_in = [
        TensorSpec(name=io.INPUT_IDS, dtype="int64", shape=["batch", "source"]),
        TensorSpec(name=io.ATTENTION_MASK, dtype="int64", shape=["batch", "source"]),
    ]
    enc_out = [
        TensorSpec(name=io.LAST_HIDDEN_STATE, dtype="float32", shape=["batch", "source", c.d_model]),
        *kv(io.cross_names(n), "source"),
    ]
    dec_in = [
        TensorSpec(name=io.INPUT_IDS, dtype="int64", shape=["batch", 1]),
        TensorSpec(name=io.POSITION_IDS, dtype="int64", shape=["batch"]),
        TensorSpec(name=io.ENCODER_ATTENTION_MASK, dtype="int64", shape=["sentences", "source"]),
        TensorSpec(name=io.FOLD, dtype="int64", shape=["sentences", "fold_width"]),
        TensorSpec(name=io.UNFOLD, dtype="int64", shape=["batch"]),
        *kv(io.cache_names(n), "slots"),
        *kv(io.cross_names(n), "source", rows="sentences"),
    ]
    dec_out = [
        TensorSpec(name=io.LOGPROBS, dtype="float32", shape=["batch", c.vocab_size]),
        *kv(io.present_names(n), "slots"),
        TensorSpec(name=io.CROSS_ATTENTIONS, dtype="float32", shape=["sentences", n, h, "fold_width", "source"]),
    ]
    return {"encoder": GraphSpec(inputs=enc_in, outputs=enc_out), "decoder": GraphSpec(inputs=dec_in, outputs=dec_out)}


def _dynamic_axes(spec: GraphSpec) -> dict[str, dict[int, str]]:
    return {t.name: {i: d for i, d in enumerate(t.shape) if isinstance(d, str)} for t in spec.inputs + spec.outputs}


def _declare_output_shapes(graph: onnx.GraphProto, spec: GraphSpec) -> None:
    """Writes the contract's output shapes into the graph (the exporter's shape inference loses
    the static sizes of a Split's outputs), so the file states the dimensions it is held to."""
    shapes = {t.name: t.shape for t in spec.outputs}
    for out in graph.output:
        dims = out.type.tensor_type.shape.dim
        for dim, want in zip(dims, shapes[out.name], strict=True):
            if isinstance(want, int):
                dim.dim_value = want
            else:
                dim.dim_param = want


def export_graph(
    module: nn.Module, args: tuple[Tensor, ...], spec: GraphSpec, path: Path, contrib: bool = False
) -> None:
    """Exports `module` called with `args` to `path` under `spec`'s IO names and shapes, checked and
    single-file. `contrib`: the graph uses ONNX Runtime's contrib operators (the decoder step, `export.fused`)."""
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
        custom_opsets={CONTRIB_DOMAIN: CONTRIB_OPSET} if contrib else None,
        dynamo=False,
        do_constant_folding=True,
    )
    proto = onnx.load(str(path))
    _declare_output_shapes(proto.graph, spec)
    onnx.save(proto, str(path))
    onnx.checker.check_model(proto)
    if any(init.data_location == onnx.TensorProto.EXTERNAL for init in proto.graph.initializer):
        raise ExportError(f"{path.name}: external tensor data; the store accepts single-file models only")


def write_classifier(model: Classifier, folder: Path) -> dict[str, str]:
    """Writes the fp32 classifier graph; returns role -> file name."""
    model.eval()
    with torch.no_grad():
        ids = torch.tensor([[5, 6, 7, 8], [9, 10, 0, 0]])
        export_graph(
            ClassifierGraph(model), (ids, (ids != 0).long()), classifier_io(model)["model"], folder / "model.onnx"
        )
    return {"model": "model.onnx"}


def write_translator(model: Translator, folder: Path) -> dict[str, str]:
    """Writes the fp32 encoder and decoder-step graphs; returns role -> file name."""
    model.eval()
    spec = translator_io(model)
    with torch.no_grad():
        ids = torch.tensor([[5, 6, 7, 8], [9, 10, 0, 0]])
        mask = (ids != 0).long()
        export_graph(EncoderGraph(model), (ids, mask), spec["encoder"], folder / "encoder.onnx")
        cross_kv = model.cross_kv(model.encode(ids, mask))
        _, past = model.decode(torch.tensor([[1, 11, 12], [1, 13, 14]]), model.empty_past(2), cross_kv, mask)
        rows = torch.tensor([0, 0, 1])  # the first sentence in two rows (beams), the second in one
        cache = [torch.cat([t[rows], torch.zeros_like(t[rows, :, :2])], dim=2) for kv in past for t in kv]  # 2 spare
        cross = [t for kv in cross_kv for t in kv]
        fold, unfold = (torch.from_numpy(a) for a in io.fold_indices([0, 2], [2, 1]))
        export_graph(
            DecoderStepGraph(model),
            (torch.tensor([[15], [17], [16]]), torch.tensor([3, 3, 2]), mask, fold, unfold, *cache, *cross),
            spec["decoder"],
            folder / "decoder.onnx",
            contrib=True,
        )
    return {"encoder": "encoder.onnx", "decoder": "decoder.onnx"}
