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
import torch
from torch import Tensor, nn

from export.graphs import DecoderStepGraph, EncoderGraph, export_graph, translator_io
from export.validate import ExportError, session
from service.contract import graphs as io
from service.contract.graphs import pad

KV = tuple[Tensor, Tensor]


class ImportedDims(Protocol):
    """What the exporter's validation reads of an imported translator's dimensions and ids."""

    @property
    def n_heads(self) -> int: ...
    @property
    def d_model(self) -> int: ...
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


def check_against_transformers(
    hf: nn.Module, model: ImportedStep, folder: Path, roles: dict[str, str], sources: list[list[int]], tol: float
) -> dict[str, object]:
    """Teacher-forced log-probabilities of the ONNX graphs against transformers' forward, every row
    of one running batch at its own position: row r joins at step r, so the cache holds rows of
    different lengths and spare slots with junk. Targets are transformers' own greedy outputs, so
    the positions checked are the ones decoding visits. Returns the figures; raises ExportError."""
    c = model.config
    enc, dec = session(folder / roles["encoder"]), session(folder / roles["decoder"])
    ids, mask = pad(sources, c.pad_id)
    t_ids, t_mask = torch.from_numpy(ids), torch.from_numpy(mask)
    steps = min(12, c.max_len - 1)  # a short position table ends before
    with torch.no_grad():
        out = hf.generate(
            input_ids=t_ids,
            attention_mask=t_mask,
            num_beams=1,
            do_sample=False,
            max_new_tokens=steps,
            min_new_tokens=steps,
        )
        tgt = out[:, :steps]  # decoder start + generated, each row as long as the longest
        ref = torch.log_softmax(hf(input_ids=t_ids, attention_mask=t_mask, decoder_input_ids=tgt).logits, -1).numpy()
    n, rows = len(model.layers), len(sources)
    cross = enc.run(io.cross_names(n), {io.INPUT_IDS: ids, io.ATTENTION_MASK: mask})
    slots = steps + rows
    junk = np.random.default_rng(0)
    dk = c.d_model // c.n_heads
    cache = [junk.normal(size=(rows, c.n_heads, slots, dk)).astype(np.float32) for _ in range(2 * n)]
    live = ~np.isneginf(model.suppress.numpy())
    worst = 0.0
    for step in range(steps + rows - 1):
        active = [r for r in range(rows) if 0 <= step - r < steps]
        pos = np.array([step - r for r in active], dtype=np.int64)
        fold, unfold = io.per_row_folding(len(active))
        feed = {
            io.INPUT_IDS: tgt.numpy()[active, pos][:, None],
            io.POSITION_IDS: pos,
            io.ENCODER_ATTENTION_MASK: mask[active],
            io.FOLD: fold,
            io.UNFOLD: unfold,
            **dict(zip(io.cache_names(n), [b[active] for b in cache], strict=True)),
            **dict(zip(io.cross_names(n), [x[active] for x in cross], strict=True)),
        }
        res = dec.run(None, feed)
        got = res[0]
        worst = max(worst, float(np.abs(got[:, live] - ref[active, pos][:, live]).max()))
        for j, new in enumerate(io.new_kv_from_present(res[1 : 1 + 2 * n], pos)):
            cache[j][active, :, pos] = new[:, :, 0]
    if worst > tol:
        why = model.mismatch_hint(tgt)
        raise ExportError(f"decoder log-probabilities differ from transformers by {worst:.2e} > {tol:.0e}{why}")
    return {"transformers_max_abs_diff": worst, "parity_sentences": rows, "parity_steps": steps}
