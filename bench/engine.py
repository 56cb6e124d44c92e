"""Engine benchmark: our ONNX Runtime engine against CTranslate2, Optimum, HF transformers and PyTorch eager.

    make bench                                    # installs .[bench], runs everything, writes bench/results/engine.json
    python -m bench.engine --tiny                 # smoke run on a tiny shape, one quick round (numbers meaningless)
    python -m bench.engine --only same-model      # the headline alone
    python -m bench.engine --only same-model-t5 --same-batches 1,32   # its T5 checkpoint

A report, not a test. The headline ("same model, every tool", bench/same_model.py, results key
`same_model`): one random-weight Marian checkpoint imported by this project (export.import_hf),
converted by ct2-transformers-converter, exported by Optimum and run by transformers `generate`,
each tool alone in a fresh process of its own; their greedy tokens must be identical before any
speed is reported. The same for a T5 checkpoint of t5-small's shape (`same-model-t5`, results key
`same_model_t5`, run only when named in --only) at a summarizer's lengths: 400 source tokens, 100
new (`T5_LENGTHS`; --src-len and --new-tokens set them too).

Then each tool on a model of its own of the same shape (d_model 256, 4 heads, FFN 1024, 3+3
layers, vocab 8000), the same source ids (24 tokens per sentence), exactly 24 new tokens per
sentence and the same thread count. Everywhere, each case is warmed up, then timed until it has
both `--min-runs` runs and `--min-time` seconds; that is repeated for `--rounds` rounds, each tool
in a fresh process per round, and the median over rounds is reported. The machine's CPU time used
by other processes meanwhile is recorded; contended numbers are flagged (†). Throughput counts
the output tokens of the best hypothesis only: batch × 24 for every tool and beam size.

- ours:      the served path: export.publish.export_model of export.model.Translator (pre-norm, GELU; a
             validated fp32 + int8 version folder), load_translator, TranslatorEngine.translate_ids
             with its EOS id set to -1, which no step can produce. `ours-int8`: the int8 variant.
             load_engine(threads=2) decodes a batch as 2 sentence shards on one-thread sessions.
- ct2:       CTranslate2 fp32 (`ct2-int8`: int8) on a transformers MarianMTModel of the same shape (GELU,
             post-norm: Marian has no pre-norm option; the FLOP count differs by one LayerNorm per stack),
             converted offline with a stand-in vocabulary. min/max_decoding_length force the length.
- hf:        the same Marian model, `generate` with use_cache, min_new_tokens = max_new_tokens.
- torch:     our Translator in PyTorch eager with its K/V cache: export.model.greedy, and a
             small cached beam below (no EOS bookkeeping: no EOS is ever produced here).
- uncached:  our engine's decoding over a full-sequence decoder graph re-run on the growing prefix.
Also: the classifier (ORT fp32 / int8 vs PyTorch eager) and achieved GFLOP/s against a measured
ORT MatMul ceiling.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from bench import same_model
from bench.engines import load_engine, newest
from bench.search_drivers import beam_search, greedy
from bench.timing import CONTENDED, Timing, contention, flag, measure, median_seconds
from export.graphs import OPSET
from export.model import (
    Classifier,
    ClassifierConfig,
    Translator,
    TranslatorConfig,
    causal_bias,
    padding_bias,
)
from export.model import greedy as torch_greedy
from export.publish import ExportOptions, export_model
from export.tokenizer import train_bpe
from service import store
from service.contract.graphs import kv_names
from service.engine import runtime
from service.engine.classifier import ClassifierEngine
from service.engine.decoding import DecodeParams
from service.engine.runtime import LoadOptions
from service.engine.translator import TranslatorEngine
from service.store import StoreEntry

# CTranslate2 configurations: compute type, and whether the threads run parallel sub-batches
CT2_TOOLS = {
    "ct2": ("float32", False),
    "ct2-workers": ("float32", True),
    "ct2-int8": ("int8", False),
    "ct2-int8-workers": ("int8", True),
}
CLASSIFIER_TOOLS = ("clf-ort-fp32", "clf-ort-int8", "clf-torch")
TOOLS = ("ours", "ours-int8", *CT2_TOOLS, "hf", "torch", "uncached", *CLASSIFIER_TOOLS, "matmul")
SAME_MODEL = "same-model"  # the headline: one Marian checkpoint through every tool (bench.same_model)
SAME_MODEL_T5 = "same-model-t5"  # the same, a T5 checkpoint of t5-small's shape (bench.same_model_t5)
SECTIONS = {SAME_MODEL: "same_model", SAME_MODEL_T5: "same_model_t5"}  # --only entry -> results key
T5_SMALL = same_model.ModelShape(vocab=32128, d_model=512, heads=8, ffn=2048, enc_layers=6, dec_layers=6)
T5_TINY = same_model.ModelShape(vocab=500, d_model=64, heads=4, ffn=128, enc_layers=1, dec_layers=1)
T5_LENGTHS, T5_TINY_LENGTHS = (400, 100), (16, 8)  # source and new tokens: a summarizer's (60-140 out)
NEVER = -1  # an EOS id no step can produce: every tool generates exactly `new_tokens`
BOS = 1
WORDS = "the a cat dog house tree red blue small big runs sleeps sees file open save close window".split()


@dataclass(frozen=True)
class Shape:
    vocab: int = 8000
    d_model: int = 256
    heads: int = 4
    ffn: int = 1024
    enc_layers: int = 3
    dec_layers: int = 3
    src_len: int = 24
    new_tokens: int = 24
    clf_len: int = 32


TINY = Shape(vocab=500, d_model=64, heads=4, ffn=128, enc_layers=1, dec_layers=1, src_len=8, new_tokens=8, clf_len=8)


# ---------------------------------------------------------------------------------------------
# FLOPs (2 per multiply-add): the work any tool must do, used for GFLOP/s and the ceilings
# ---------------------------------------------------------------------------------------------


def translate_flops(s: Shape, batch: int, beam: int) -> float:
    d, f, v, src = s.d_model, s.ffn, s.vocab, s.src_len
    enc_tok = s.enc_layers * (4 * d * d + 2 * d * f) + s.dec_layers * 2 * d * d  # + cross K/V
    enc = batch * (src * enc_tok + s.enc_layers * 2 * src * src * d)
    dec = 0
    for i in range(s.new_tokens):
        rows = batch if i == 0 else batch * beam  # the first step runs from BOS, one row per sentence
        layer = 6 * d * d + 2 * d * f + 2 * (i + 1) * d + 2 * src * d  # projections, FFN, self/cross attention
        dec += rows * (s.dec_layers * layer + d * v)
    return 2.0 * (enc + dec)


def classifier_flops(s: Shape, batch: int) -> float:
    d, f, n = s.d_model, s.ffn, s.clf_len
    return 2.0 * batch * s.enc_layers * (n * (4 * d * d + 2 * d * f) + 2 * n * n * d)


# ---------------------------------------------------------------------------------------------
# Our models: random weights, exported with export.publish.export_model
# ---------------------------------------------------------------------------------------------


def our_translator(s: Shape) -> Translator:
    torch.manual_seed(0)
    cfg = TranslatorConfig(
        vocab_size=s.vocab,
        d_model=s.d_model,
        n_heads=s.heads,
        d_ff=s.ffn,
        n_layers=s.enc_layers,
        n_dec_layers=s.dec_layers,
        dropout=0.0,
        max_len=max(64, s.src_len + s.new_tokens + 2),  # a short position table keeps the export's parity check quick
        bos_id=BOS,
        eos_id=2,  # the export appends it to every source; the bench sets NEVER after publishing
    )
    return Translator(cfg).eval()


def publish(model: Classifier | Translator, store_dir: Path, name: str) -> StoreEntry:
    """The serving path: export_model (validated fp32 + int8 version folder), then the registry's entry."""
    texts = [" ".join(WORDS[(i * 7 + j * 3) % len(WORDS)] for j in range(3 + i % 6)) for i in range(8)]
    tok = train_bpe(texts * 20, vocab_size=400)
    labels = ["negative", "neutral", "positive"] if isinstance(model, Classifier) else []
    options = ExportOptions(name, 1, variants=("fp32", "int8"), labels=tuple(labels), min_parity_sentences=len(texts))
    export_model(model, tok, store_dir, options, validation_texts=texts, log=lambda _: None)
    return newest(store.scan(store_dir))[name]


class FullDecoderGraph(nn.Module):
    """Uncached decoding: the whole prefix every step (empty past), log-probs of the last position only."""

    def __init__(self, model: Translator) -> None:
        super().__init__()
        self.model = model
        self.n = len(model.layers)

    def forward(self, input_ids: Tensor, encoder_attention_mask: Tensor, *cross_kv: Tensor) -> Tensor:
        m = self.model
        cross = [(cross_kv[2 * i], cross_kv[2 * i + 1]) for i in range(self.n)]
        past = m.empty_past(input_ids.size(0))
        x = m.embed(input_ids, 0)  # (B, T, D)
        self_bias = causal_bias(input_ids.size(1), 0, input_ids.device)  # (T, T)
        src_bias = padding_bias(encoder_attention_mask)  # (B, 1, 1, S)
        for layer, layer_past, layer_cross in zip(m.layers, past, cross, strict=True):
            x, _, _ = layer(x, layer_past, layer_cross, self_bias, src_bias)
        logits = m.norm(x[:, -1]) @ m.embed.tokens.weight.T  # (B, V): the projection on the last position only
        return torch.log_softmax(logits, dim=-1)


def export_full_decoder(model: Translator, path: Path) -> None:
    n = len(model.layers)
    ids = torch.tensor([[5, 6, 7, 8], [9, 10, 0, 0]])
    mask = (ids != 0).long()
    with torch.no_grad():
        cross = [t for kv in model.cross_kv(model.encode(ids, mask)) for t in kv]
    names = kv_names("cross_key_values", n)
    axes = {"input_ids": {0: "batch", 1: "length"}, "encoder_attention_mask": {0: "batch", 1: "source"}}
    axes.update({name: {0: "batch", 2: "source"} for name in names})
    axes["logprobs"] = {0: "batch"}
    torch.onnx.export(
        FullDecoderGraph(model).eval(),
        (torch.tensor([[1, 11, 12], [1, 13, 14]]), mask, *cross),
        str(path),
        input_names=["input_ids", "encoder_attention_mask", *names],
        output_names=["logprobs"],
        dynamic_axes=axes,
        opset_version=OPSET,
        dynamo=False,
    )


@dataclass
class PrefixState:
    prefix: np.ndarray  # (R, t) BOS + generated tokens
    cross: list[np.ndarray]  # 2L arrays (R, H, S, d_k)
    mask: np.ndarray  # (R, S)


class UncachedStep:
    """A StepFn re-running the full decoder graph on the growing prefix."""

    def __init__(self, encoder: runtime.ort.InferenceSession, full: runtime.ort.InferenceSession, n: int) -> None:
        self.encoder, self.full = encoder, full
        self.cross_names = kv_names("cross_key_values", n)

    def encode(self, ids: np.ndarray, mask: np.ndarray) -> PrefixState:
        cross = self.encoder.run(self.cross_names, {"input_ids": ids, "attention_mask": mask})
        return PrefixState(np.zeros((ids.shape[0], 0), np.int64), cross, mask)

    def step(self, tokens: np.ndarray, state: PrefixState, rows: np.ndarray) -> tuple[np.ndarray, PrefixState]:
        prefix = np.concatenate([state.prefix[rows], tokens.reshape(-1, 1).astype(np.int64)], axis=1)
        cross = [np.take(c, rows, axis=0) for c in state.cross]
        mask = state.mask[rows]
        feed = {"input_ids": prefix, "encoder_attention_mask": mask, **dict(zip(self.cross_names, cross, strict=True))}
        logp = self.full.run(["logprobs"], feed)[0]
        return logp, PrefixState(prefix, cross, mask)


def decode_ours(
    encode: Callable[[np.ndarray, np.ndarray], object], step: Callable, ids: np.ndarray, beam: int, new: int
) -> list[tuple[int, ...]]:
    """What TranslatorEngine.translate_ids does, for a step function of the bench's own (uncached)."""
    mask = np.ones_like(ids)
    state = encode(ids, mask)
    limits = [new] * ids.shape[0]
    if beam == 1:
        return [h.tokens for h in greedy(step, state, BOS, NEVER, limits)]
    params = DecodeParams(beam_size=beam, max_new_tokens=new)
    return [h[0].tokens for h in beam_search(step, state, BOS, NEVER, params, limits)]


def translate_engine(engine: TranslatorEngine, seqs: list[list[int]], beam: int, new: int) -> list[tuple[int, ...]]:
    """The served path: TranslatorEngine.translate_ids (its EOS id set to one no step can produce)."""
    return [h[0].tokens for h in engine.translate_ids(seqs, DecodeParams(beam_size=beam, max_new_tokens=new))]


# ---------------------------------------------------------------------------------------------
# PyTorch eager, our model
# ---------------------------------------------------------------------------------------------


@torch.inference_mode()
def torch_beam_cached(model: Translator, src: Tensor, mask: Tensor, k: int, new: int) -> Tensor:
    """Cached beam search (flat B*K rows, top-k over a (B, K*V) view); best hypothesis (B, new)."""
    b, v = src.size(0), model.config.vocab_size
    cross = model.cross_kv(model.encode(src, mask))
    tok = torch.full((b, 1), BOS, dtype=torch.long)
    logits, past = model.decode(tok, model.empty_past(b), cross, mask)
    cum, idx = torch.log_softmax(logits[:, -1], -1).topk(k)  # (B, K) from the single BOS row
    rows = torch.arange(b).repeat_interleave(k)
    cross = [(ck[rows], cv[rows]) for ck, cv in cross]
    mask = mask[rows]
    past = [(pk[rows], pv[rows]) for pk, pv in past]
    tok = idx.reshape(-1, 1)  # (B*K, 1)
    hist = tok
    cum = cum.reshape(-1)
    for _ in range(new - 1):
        logits, past = model.decode(tok, past, cross, mask)
        scores = torch.log_softmax(logits[:, -1], -1) + cum[:, None]  # (B*K, V)
        cum, idx = scores.view(b, k * v).topk(k)  # (B, K)
        rows = (torch.arange(b)[:, None] * k + idx // v).reshape(-1)  # (B*K,) source row of each beam
        tok = (idx % v).reshape(-1, 1)
        past = [(pk[rows], pv[rows]) for pk, pv in past]
        hist = torch.cat([hist[rows], tok], dim=1)
        cum = cum.reshape(-1)
    return hist.view(b, k, -1)[:, 0]


# ---------------------------------------------------------------------------------------------
# Marian: HF transformers and CTranslate2
# ---------------------------------------------------------------------------------------------


def marian_model(s: Shape):  # type: ignore[no-untyped-def]
    from transformers import MarianConfig, MarianMTModel

    torch.manual_seed(0)
    # Marian's vocabulary ends with <pad> (the decoder start); CTranslate2 drops it, leaving s.vocab.
    cfg = MarianConfig(
        vocab_size=s.vocab + 1,
        d_model=s.d_model,
        encoder_layers=s.enc_layers,
        decoder_layers=s.dec_layers,
        encoder_attention_heads=s.heads,
        decoder_attention_heads=s.heads,
        encoder_ffn_dim=s.ffn,
        decoder_ffn_dim=s.ffn,
        activation_function="gelu",
        max_position_embeddings=256,
        dropout=0.0,
        attention_dropout=0.0,
        activation_dropout=0.0,
        scale_embedding=True,
        pad_token_id=s.vocab,
        decoder_start_token_id=s.vocab,
        eos_token_id=2,
        bos_token_id=BOS,
        forced_eos_token_id=None,
    )
    return MarianMTModel(cfg).eval()


def stand_in_vocab(s: Shape) -> list[str]:
    tokens = [f"t{i}" for i in range(s.vocab)] + ["<pad>"]
    tokens[0], tokens[1], tokens[2], tokens[3] = "<blank>", "<unk>", "</s>", "<s>"
    return tokens


def convert_ct2(model_dir: Path, out: Path, s: Shape) -> None:
    """The converter wants a tokenizer only for its vocabulary and special tokens: give it a stand-in."""
    from ctranslate2.converters import TransformersConverter

    class StandIn:
        eos_token, unk_token = "</s>", "<unk>"

        def get_vocab(self) -> dict[str, int]:
            return {t: i for i, t in enumerate(stand_in_vocab(s))}

    class OfflineConverter(TransformersConverter):
        def load_tokenizer(self, tokenizer_class, model_name_or_path, **kwargs):  # type: ignore[no-untyped-def]
            return StandIn()

    OfflineConverter(str(model_dir)).convert(str(out), quantization="float32", force=True)


# ---------------------------------------------------------------------------------------------
# ORT MatMul ceiling
# ---------------------------------------------------------------------------------------------


CLF_CEILING_BATCH = 32  # the classifier batch whose FFN shape is measured as a ceiling


def classifier_ffn(s: Shape, int8: bool) -> str:
    """The name of the ceiling row measured at the classifier FFN's shape (batch `CLF_CEILING_BATCH`)."""
    b = CLF_CEILING_BATCH
    return f"{b * s.clf_len}x{s.d_model}x{s.ffn} (the classifier's FFN at batch {b})" + (" int8" if int8 else "")


def matmul_ceiling(threads: int, m: int, k: int, n: int, timing: Timing, int8: bool = False) -> float:
    """GFLOP/s (2 per multiply-add) of one ORT weight matmul (m, k) x (k, n): fp32 MatMul, or with
    `int8` the MatMulIntegerToFloat the int8 graphs run (uint8 activations, int8 weights, scales,
    zero points, a bias), fed already-quantized inputs: the kernel alone, the most an int8 graph's
    matmuls can do."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    if int8:
        inits = [
            numpy_helper.from_array(rng.integers(-127, 128, (k, n)).astype(np.int8), "W"),
            numpy_helper.from_array(np.array(0.02, np.float32), "a_scale"),
            numpy_helper.from_array(np.full(n, 0.01, np.float32), "w_scale"),
            numpy_helper.from_array(np.array(128, np.uint8), "a_zero"),
            numpy_helper.from_array(np.zeros(n, np.int8), "w_zero"),
            numpy_helper.from_array(np.zeros(n, np.float32), "bias"),
        ]
        node = helper.make_node(
            "MatMulIntegerToFloat",
            ["A", "W", "a_scale", "w_scale", "a_zero", "w_zero", "bias"],
            ["Y"],
            domain="com.microsoft",
        )
        a_type, a = TensorProto.UINT8, rng.integers(0, 256, (m, k)).astype(np.uint8)
    else:
        inits = [numpy_helper.from_array(rng.standard_normal((k, n)).astype(np.float32), "W")]
        node = helper.make_node("MatMul", ["A", "W"], ["Y"])
        a_type, a = TensorProto.FLOAT, rng.standard_normal((m, k)).astype(np.float32)
    graph = helper.make_graph(
        [node],
        "matmul",
        [helper.make_tensor_value_info("A", a_type, [m, k])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [m, n])],
        inits,
    )
    opsets = [helper.make_opsetid("", OPSET), helper.make_opsetid("com.microsoft", 1)]
    model = helper.make_model(graph, opset_imports=opsets)
    model.ir_version = 8  # what any ONNX Runtime reads: onnx's own default can be newer than the runtime installed
    sess = runtime.make_session(model.SerializeToString(), ["CPUExecutionProvider"], threads)
    sec, _, _ = median_seconds(lambda: sess.run(["Y"], {"A": a}), timing)
    return 2.0 * m * k * n / sec / 1e9


# ---------------------------------------------------------------------------------------------
# The run
# ---------------------------------------------------------------------------------------------


@dataclass
class Case:
    """One measured configuration; `samples` holds (median seconds, runs, others' CPU share) per round."""

    kind: str  # "translation" | "classifier"
    tool: str
    batch: int
    beam: int  # 0 for the classifier
    fn: Callable[[], object]
    samples: list[tuple[float, int, float | None]] = field(default_factory=list)


class Bench:
    """One run: the shape, the timing rule, the shared inputs and the rows measured so far."""

    def __init__(
        self, s: Shape, threads: int, timing: Timing, batches: list[int], beams: list[int], retries: int = 0
    ) -> None:
        self.s, self.threads, self.timing, self.batches, self.beams = s, threads, timing, batches, beams
        self.retries = retries
        self.pending: list[Case] = []
        rng = np.random.default_rng(0)
        self.inputs = {b: rng.integers(5, s.vocab, size=(b, s.src_len), dtype=np.int64) for b in batches}
        self.clf_inputs = {b: rng.integers(5, s.vocab, size=(b, s.clf_len), dtype=np.int64) for b in batches}
        self.rows: list[dict[str, object]] = []
        self.clf_rows: list[dict[str, object]] = []
        self.tmp = Path(tempfile.mkdtemp(prefix="bench-engine-"))

    def session(self, path: Path) -> runtime.ort.InferenceSession:
        return runtime.make_session(path.read_bytes(), ["CPUExecutionProvider"], self.threads)

    def measure(self, fn: Callable[[], object]) -> tuple[float, int, float | None]:
        return measure(fn, self.timing, self.retries)

    def record(self, tool: str, batch: int, beam: int, fn: Callable[[], object]) -> None:
        """Checks that fn generates exactly new_tokens per sentence, then queues it for measuring."""
        out = fn()
        lens = {len(r) for r in out}  # type: ignore[attr-defined]
        if len(out) != batch or lens != {self.s.new_tokens}:  # type: ignore[arg-type]
            raise RuntimeError(f"{tool}: expected {batch} rows of {self.s.new_tokens} tokens, got lengths {lens}")
        self.pending.append(Case("translation", tool, batch, beam, fn))

    def run_rounds(self, rounds: int) -> None:
        """Every queued case once per round, the tools of one case next to each other, so that a slow
        drift of the shared machine hits all of them alike; a case reports its median over rounds."""
        order = sorted(self.pending, key=lambda c: (c.kind != "translation", c.beam, c.batch))
        for r in range(rounds):
            print(f"round {r + 1} of {rounds}", flush=True)
            for c in order:
                time.sleep(0.3)  # let the previous tool's spinning worker threads park
                sec, n, others = self.measure(c.fn)
                c.samples.append((sec, n, others))
                what = f"beam {c.beam}" if c.kind == "translation" else "classifier"
                print(f"  {c.tool:<16} batch {c.batch:>3} {what}: {sec * 1e3:9.2f} ms ({n} runs){flag(others)}")
        for c in self.pending:
            sec = statistics.median(s[0] for s in c.samples)
            shares = [s[2] for s in c.samples if s[2] is not None]
            others = statistics.median(shares) if shares else None
            row = {"tool": c.tool, "batch": c.batch, "seconds": sec, "round_seconds": [s[0] for s in c.samples]}
            if c.kind == "translation":
                row |= {"beam": c.beam, "tokens_per_s": c.batch * self.s.new_tokens / sec}
                row["gflops"] = translate_flops(self.s, c.batch, c.beam) / sec / 1e9
                self.rows.append({**row, "others_cpu": others})
            else:
                row |= {"sequences_per_s": c.batch / sec, "gflops": classifier_flops(self.s, c.batch) / sec / 1e9}
                self.clf_rows.append({**row, "others_cpu": others})

    def cases(self) -> list[tuple[int, int]]:
        return [(beam, b) for beam in self.beams for b in self.batches]

    def load(self, entry: StoreEntry, variant: str) -> ClassifierEngine | TranslatorEngine:
        return load_engine(entry, LoadOptions(providers=("cpu",), threads=self.threads, variant=variant))

    def ours(self, tools: set[str]) -> float:
        """This engine (fp32, int8) cached and uncached, and our model in PyTorch eager; returns greedy parity."""
        s = self.s
        model = our_translator(s)
        entry = publish(model, self.tmp / "store", "bench-mt")
        model.config.eos_id = NEVER  # greedy: exactly new_tokens for every sentence
        engines = {}
        for tool, variant in (("ours", "fp32"), ("ours-int8", "int8")):
            engine = self.load(entry, variant)
            assert isinstance(engine, TranslatorEngine)
            engine.eos_id = NEVER  # exactly new_tokens for every sentence
            engines[tool] = engine
        folder = entry.folder
        export_full_decoder(model, self.tmp / "decoder_full.onnx")
        unc = UncachedStep(
            self.session(folder / "encoder.onnx"), self.session(self.tmp / "decoder_full.onnx"), s.dec_layers
        )
        # sanity: the engine and PyTorch eager decode the same model to the same greedy tokens
        ids = self.inputs[max(self.batches)]
        mine = translate_engine(engines["ours"], ids.tolist(), 1, s.new_tokens)
        ref = torch_greedy(model, torch.from_numpy(ids), torch.ones_like(torch.from_numpy(ids)), s.new_tokens)
        parity = sum(list(a) == b for a, b in zip(mine, ref, strict=True)) / len(ref)
        print(f"greedy parity, this engine vs PyTorch: {parity:.0%} of {len(ref)} sentences identical")
        for beam, b in self.cases():
            ids = self.inputs[b]
            seqs = ids.tolist()
            t_ids, t_mask = torch.from_numpy(ids), torch.ones((b, s.src_len), dtype=torch.long)
            for tool, engine in engines.items():
                if tool in tools:
                    self.record(tool, b, beam, partial(translate_engine, engine, seqs, beam, s.new_tokens))
            if "uncached" in tools:
                self.record("uncached", b, beam, partial(decode_ours, unc.encode, unc.step, ids, beam, s.new_tokens))
            if "torch" in tools:
                if beam == 1:
                    self.record("torch", b, beam, partial(torch_greedy, model, t_ids, t_mask, s.new_tokens))
                else:
                    self.record("torch", b, beam, partial(torch_beam_cached, model, t_ids, t_mask, beam, s.new_tokens))
        return parity

    def marian(self, tools: set[str]) -> None:
        """CTranslate2 and HF generate on one random Marian model of the same shape."""
        s = self.s
        model = marian_model(s)
        model.save_pretrained(self.tmp / "marian")
        vocab = stand_in_vocab(s)
        # CTranslate2 both ways to use the threads: intra-op (one batch, `threads` threads) and workers
        # (`threads` sub-batches decoded in parallel, one thread each), like this engine's shards.
        translators: dict[str, tuple[Any, bool]] = {}
        if tools & set(CT2_TOOLS):
            import ctranslate2

            convert_ct2(self.tmp / "marian", self.tmp / "ct2", s)
            for tool, (compute, workers) in CT2_TOOLS.items():
                if tool in tools:
                    translator = ctranslate2.Translator(
                        str(self.tmp / "ct2"),
                        device="cpu",
                        compute_type=compute,
                        inter_threads=self.threads if workers else 1,
                        intra_threads=1 if workers else self.threads,
                    )
                    translators[tool] = (translator, workers)

        def ct2(translator: Any, workers: bool, src: list[list[str]], beam: int) -> list[list[str]]:
            res = translator.translate_batch(
                src,
                beam_size=beam,
                max_decoding_length=s.new_tokens,
                min_decoding_length=s.new_tokens,
                max_batch_size=-(-len(src) // self.threads) if workers else 0,
                num_hypotheses=1,
            )
            return [r.hypotheses[0] for r in res]

        @torch.inference_mode()
        def hf(ids: Tensor, mask: Tensor, beam: int) -> list[list[int]]:
            out = model.generate(
                input_ids=ids,
                attention_mask=mask,
                max_new_tokens=s.new_tokens,
                min_new_tokens=s.new_tokens,
                num_beams=beam,
                do_sample=False,
                use_cache=True,
            )
            return out[:, 1:].tolist()  # without the decoder start token

        for beam, b in self.cases():
            ids = self.inputs[b]
            src = [[vocab[i] for i in row] for row in ids.tolist()]
            for tool, (translator, workers) in translators.items():
                self.record(tool, b, beam, partial(ct2, translator, workers, src, beam))
            if "hf" in tools:
                t_ids, t_mask = torch.from_numpy(ids), torch.ones((b, s.src_len), dtype=torch.long)
                self.record("hf", b, beam, partial(hf, t_ids, t_mask, beam))

    def classifier(self, tools: set[str]) -> None:
        s = self.s
        print(f"classifier: sequence {s.clf_len}")
        torch.manual_seed(1)
        cfg = ClassifierConfig(
            vocab_size=s.vocab, d_model=s.d_model, n_heads=s.heads, d_ff=s.ffn, n_layers=s.enc_layers, dropout=0.0
        )
        clf = Classifier(cfg).eval()
        entry = publish(clf, self.tmp / "store", "bench-clf")
        fp32, int8 = self.load(entry, "fp32"), self.load(entry, "int8")
        assert isinstance(fp32, ClassifierEngine) and isinstance(int8, ClassifierEngine)
        eager = torch.inference_mode()(clf)
        for b in self.batches:
            ids = self.clf_inputs[b]
            mask = np.ones_like(ids)
            fns: dict[str, Callable[[], object]] = {
                "clf-ort-fp32": partial(runtime.run_classifier, fp32.session, ids, mask),
                "clf-ort-int8": partial(runtime.run_classifier, int8.session, ids, mask),
                "clf-torch": partial(eager, torch.from_numpy(ids), torch.from_numpy(mask)),
            }
            for name, fn in fns.items():
                if name in tools:
                    self.pending.append(Case("classifier", name.removeprefix("clf-"), b, 0, fn))


def measure_tool(args: argparse.Namespace, tool: str) -> list[dict[str, object]]:
    """The worker: one tool's cases, measured once, in this (fresh) process."""
    s = shape(args)
    torch.set_num_threads(args.threads)
    bench = Bench(
        s,
        args.threads,
        Timing(args.min_runs, args.min_time, args.warmup),
        [int(x) for x in args.batches.split(",")],
        [int(x) for x in args.beams.split(",")],
        args.retries,
    )
    try:
        if tool == "matmul":
            big = 256 if args.tiny else 2048
            return [
                {
                    "tool": "matmul",
                    "what": f"{big}x{big}x{big}",
                    "gflops": matmul_ceiling(args.threads, big, big, big, bench.timing),
                },
                {
                    "tool": "matmul",
                    "what": f"32x{s.d_model}x{s.ffn} (a decode step's FFN)",
                    "gflops": matmul_ceiling(args.threads, 32, s.d_model, s.ffn, bench.timing),
                },
                *(
                    {
                        "tool": "matmul",
                        "what": classifier_ffn(s, int8),
                        "gflops": matmul_ceiling(
                            args.threads, CLF_CEILING_BATCH * s.clf_len, s.d_model, s.ffn, bench.timing, int8
                        ),
                    }
                    for int8 in (False, True)
                ),
                {
                    "tool": "matmul",
                    "what": f"{big}x{big}x{big} int8",
                    "gflops": matmul_ceiling(args.threads, big, big, big, bench.timing, int8=True),
                },
            ]
        if tool in {"ours", "ours-int8", "uncached", "torch"}:
            bench.ours({tool})
        elif tool in {*CT2_TOOLS, "hf"}:
            bench.marian({tool})
        else:
            bench.classifier({tool})
        bench.run_rounds(1)
    finally:
        shutil.rmtree(bench.tmp, ignore_errors=True)
    rows = bench.rows + bench.clf_rows
    for row in rows:
        row["kind"] = "classifier" if tool in CLASSIFIER_TOOLS else "translation"
    return rows


def shape(args: argparse.Namespace) -> Shape:
    s = TINY if args.tiny else Shape()
    return replace(s, new_tokens=args.new_tokens or s.new_tokens, src_len=args.src_len or s.src_len)


def same_model_section(args: argparse.Namespace, s: Shape, family: str = "marian") -> dict[str, object]:
    """The headline: one Marian checkpoint through every tool (bench.same_model); with family "t5",
    a T5 checkpoint of t5-small's shape at a summarizer's lengths."""
    tools = args.same_tools.split(",")
    if unknown := set(tools) - set(same_model.TOOLS):
        raise SystemExit(f"unknown --same-tools entries {sorted(unknown)}; choose from {','.join(same_model.TOOLS)}")
    if family == "t5":
        model = T5_TINY if args.tiny else T5_SMALL
        src_len, new_tokens = T5_TINY_LENGTHS if args.tiny else T5_LENGTHS
        src_len, new_tokens = args.src_len or src_len, args.new_tokens or new_tokens
    else:
        model = same_model.ModelShape(s.vocab, s.d_model, s.heads, s.ffn, s.enc_layers, s.dec_layers)
        src_len, new_tokens = s.src_len, s.new_tokens
    optimum = args.optimum_path or same_model.default_optimum_path()
    print(f"same model ({family}): {src_len} source tokens, {new_tokens} new tokens, {args.threads} threads")
    with tempfile.TemporaryDirectory(prefix="bench-same-model-") as work:
        return same_model.run(
            model,
            threads=args.threads,
            batches=[int(x) for x in args.same_batches.split(",")],
            beams=[int(x) for x in args.beams.split(",")],
            src_len=src_len,
            new_tokens=new_tokens,
            timing=Timing(args.min_runs, args.min_time, args.warmup),
            retries=args.retries,
            rounds=args.rounds,
            work=Path(work),
            tools=tools,
            optimum_path=optimum,
            family=family,
        )


def run(args: argparse.Namespace) -> dict[str, object]:
    """Every tool alone in a fresh process of its own, round after round; the median per case."""
    choices = (*SECTIONS, *TOOLS)
    # the T5 section only by name: at its lengths a case takes minutes on 2 cores (transformers'
    # beam 4 at batch 32: over 6 minutes a call), hours with the default rounds
    tools = args.only.split(",") if args.only else [c for c in choices if c != SAME_MODEL_T5]
    if unknown := set(tools) - set(choices):
        raise SystemExit(f"unknown --only entries {sorted(unknown)}; choose from {','.join(choices)}")
    s = shape(args)
    results: dict[str, object] = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "shape": asdict(s),
        "threads": args.threads,
        "machine": {"cpu": _cpu_name(), "cores": os.cpu_count(), "python": platform.python_version()},
        "versions": _versions(),
        "method": "every tool in a fresh process of its own, one after another, same inputs and thread count; "
        "warm-up, then the median of timed runs; repeated for each round, the median over rounds reported",
        "contention_start": contention(),
    }
    for section, key in SECTIONS.items():
        if section in tools:
            tools.remove(section)
            results[key] = same_model_section(args, s, "t5" if section == SAME_MODEL_T5 else "marian")
    if tools:
        print(f"translation: {s.src_len} source tokens, {s.new_tokens} new tokens, {args.threads} threads")
    samples: dict[tuple[object, ...], list[dict[str, object]]] = {}
    matmul: dict[str, list[float]] = {}
    for r in range(args.rounds if tools else 0):
        print(f"round {r + 1} of {args.rounds}", flush=True)
        for tool in tools:
            for row in _in_fresh_process(args, tool):
                if row["tool"] == "matmul":
                    matmul.setdefault(str(row["what"]), []).append(float(row["gflops"]))  # type: ignore[arg-type]
                    continue
                key = (row["kind"], row["tool"], row["batch"], row.get("beam", 0))
                samples.setdefault(key, []).append(row)
    translation, classifier = [], []
    for (kind, *_), rows in samples.items():
        out = dict(rows[0])
        for name in ("seconds", "tokens_per_s", "sequences_per_s", "gflops"):
            if name in out:
                out[name] = statistics.median(float(x[name]) for x in rows)  # type: ignore[arg-type]
        shares = [float(x["others_cpu"]) for x in rows if x.get("others_cpu") is not None]  # type: ignore[arg-type]
        out["others_cpu"] = statistics.median(shares) if shares else None
        out["round_seconds"] = [x["seconds"] for x in rows]
        (classifier if kind == "classifier" else translation).append(out)
    results["rounds"] = args.rounds
    results["translation"], results["classifier"] = translation, classifier
    if matmul:
        results["matmul_gflops"] = {what: statistics.median(v) for what, v in matmul.items()}
        print(f"ORT MatMul GFLOP/s: {results['matmul_gflops']}")
    results["contention_end"] = contention()
    return results


def _measuring(args: argparse.Namespace) -> list[str]:
    """The options that decide what a worker measures, as command-line arguments."""
    out = ["--tiny"] if args.tiny else []
    for name in ("batches", "beams", "threads", "src_len", "new_tokens", "min_runs", "min_time", "warmup", "retries"):
        out += ["--" + name.replace("_", "-"), str(getattr(args, name))]
    return out


def _in_fresh_process(args: argparse.Namespace, tool: str) -> list[dict[str, object]]:
    with tempfile.TemporaryDirectory(prefix="bench-worker-") as tmp:
        out = Path(tmp) / "rows.json"
        cmd = [sys.executable, "-m", "bench.engine", "--worker", tool, "--worker-out", str(out), *_measuring(args)]
        done = subprocess.run(cmd, cwd=Path(__file__).resolve().parents[1], text=True, capture_output=True)
        if done.returncode != 0:
            raise RuntimeError(f"bench worker {tool} failed:\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}")
        print("\n".join(line for line in done.stdout.splitlines() if line.startswith("  ")), flush=True)
        return json.loads(out.read_text())  # type: ignore[no-any-return]


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def _versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for pkg in ("onnxruntime", "torch", "numpy", "ctranslate2", "transformers"):
        try:
            out[pkg] = version(pkg)
        except PackageNotFoundError:
            out[pkg] = "-"
    return out


# ---------------------------------------------------------------------------------------------
# Report
# ---------------------------------------------------------------------------------------------


def markdown(results: dict[str, object]) -> str:
    """The same-model sections (the headline, then T5's) first, then the per-tool comparisons."""
    rest = tool_tables(results)
    machine: dict[str, Any] = results["machine"]  # type: ignore[assignment]
    heads = [
        same_model.markdown(results[key], machine["cpu"], machine["cores"])  # type: ignore[arg-type]
        for key in SECTIONS.values()
        if key in results
    ]
    if not heads:
        return rest
    head = "\n\n".join(heads)
    return head + ("\n\nEach tool on a model of its own, of the same shape.\n\n" + rest if rest else "")


def tool_tables(results: dict[str, object]) -> str:
    s = Shape(**results["shape"])  # type: ignore[arg-type]
    rows: list[dict] = results["translation"]  # type: ignore[assignment]
    by = {(r["tool"], r["batch"], r["beam"]): r for r in rows}
    cases = sorted({(r["beam"], r["batch"]) for r in rows})
    threads = results["threads"]
    names = {
        "ours": "this engine fp32 (ORT, cached)",
        "ct2": f"CTranslate2 fp32, 1 worker × {threads} threads",
        "ct2-workers": f"CTranslate2 fp32, {threads} workers × 1 thread",
        "hf": "HF transformers generate fp32",
        "torch": "PyTorch eager fp32 (cached)",
        "uncached": "this engine fp32, uncached graph",
        "ours-int8": "this engine int8 (static, MatMulIntegerToFloat)",
        "ct2-int8": f"CTranslate2 int8, 1 worker × {threads} threads",
        "ct2-int8-workers": f"CTranslate2 int8, {threads} workers × 1 thread",
    }
    tools = [t for t in names if any(r["tool"] == t for r in rows)]

    def best_ct2(t: str, b: int, beam: int) -> dict | None:
        """The faster CTranslate2 configuration at the precision of tool t: the one every ratio is against."""
        pool = ("ct2-int8", "ct2-int8-workers") if t.endswith("int8") else ("ct2", "ct2-workers")
        found = [by[(c, b, beam)] for c in pool if (c, b, beam) in by]
        return max(found, key=lambda r: r["tokens_per_s"]) if found else None

    tools = [t for t in names if any(r["tool"] == t for r in rows)]
    ceilings: dict[str, float] = results.get("matmul_gflops") or {}  # type: ignore[assignment]
    peak = max((v for what, v in ceilings.items() if not what.endswith("int8")), default=0.0)
    peak_int8 = max((v for what, v in ceilings.items() if what.endswith("int8")), default=0.0)
    out: list[str] = []
    if rows:
        head = [f"{'greedy' if beam == 1 else f'beam {beam}'}, batch {b}" for beam, b in cases]
        out += [
            "Tokens/s (output tokens of the best hypothesis; in brackets × the faster CTranslate2 configuration "
            "of the same precision); "
            f"{s.src_len} source and "
            f"{s.new_tokens} new tokens per sentence, {results['threads']} threads, {results['machine']['cpu']}.",  # type: ignore[index]
            "",
            "| tool | " + " | ".join(head) + " |",
            "|---|" + "---:|" * len(head),
        ]
        for t in tools:
            cells = []
            for beam, b in cases:
                r, ref = by.get((t, b, beam)), best_ct2(t, b, beam)
                if r is None:
                    cells.append("–")
                    continue
                ratio = f" ({r['tokens_per_s'] / ref['tokens_per_s']:.2f}×)" if ref and not t.startswith("ct2") else ""
                cells.append(f"{r['tokens_per_s']:,.0f}{ratio}{_mark(r, ref)}")
            out.append(f"| {names[t]} | " + " | ".join(cells) + " |")
        if peak:
            cells = [f"{peak * 1e9 * s.new_tokens * b / translate_flops(s, b, beam):,.0f}" for beam, b in cases]
            out.append(f"| ceiling at {peak:.0f} GFLOP/s (ORT MatMul) | " + " | ".join(cells) + " |")
            cells = [f"{by[('ours', b, beam)]['gflops']:.0f}" if ("ours", b, beam) in by else "–" for beam, b in cases]
            out.append("| this engine, achieved GFLOP/s | " + " | ".join(cells) + " |")
        int8 = [by.get(("ours-int8", b, beam)) for beam, b in cases]
        if peak_int8 and any(int8):
            cells = [f"{r['gflops']:.0f}" if r else "–" for r in int8]
            label = f"this engine int8, achieved GOP/s (int8 MatMul: {peak_int8:.0f})"
            out.append(f"| {label} | " + " | ".join(cells) + " |")
        fp32 = [by.get(("ours", b, beam)) for beam, b in cases]
        if any(a and f for a, f in zip(int8, fp32, strict=True)):
            ratios = [
                f"{h} {a['tokens_per_s'] / f['tokens_per_s']:.2f}×"
                for h, a, f in zip(head, int8, fp32, strict=True)
                if a and f
            ]
            out += ["", "This engine, int8 ÷ fp32 tokens/s: " + "; ".join(ratios) + "."]
    clf: list[dict] = results.get("classifier") or []  # type: ignore[assignment]
    if clf:
        batches = sorted({r["batch"] for r in clf})
        cb = {(r["tool"], r["batch"]): r for r in clf}
        out += ["", f"Classifier, sequences/s (×PyTorch eager), sequence {s.clf_len}:", ""]
        out += ["| tool | " + " | ".join(f"batch {b}" for b in batches) + " |", "|---|" + "---:|" * len(batches)]
        for t in ("ort-fp32", "ort-int8", "torch"):  # the clf- tools, named by their rows
            cells = []
            for b in batches:
                r, ref = cb.get((t, b)), cb.get(("torch", b))
                ratio = f" ({r['sequences_per_s'] / ref['sequences_per_s']:.2f}×)" if r and ref and t != "torch" else ""
                cells.append(f"{r['sequences_per_s']:,.0f}{ratio}{_mark(r, ref)}" if r else "–")
            out.append(f"| {t} | " + " | ".join(cells) + " |")
        b = CLF_CEILING_BATCH
        achieved = [
            f"{r['gflops']:.0f} {unit} {precision}, {r['gflops'] / ceilings[what]:.0%} of {ceilings[what]:.0f}"
            for tool, precision, unit, what in (
                ("ort-fp32", "fp32", "GFLOP/s", classifier_ffn(s, False)),
                ("ort-int8", "int8", "GOP/s", classifier_ffn(s, True)),
            )
            if (r := cb.get((tool, b))) and ceilings.get(what)
        ]
        if achieved:  # the acceptance's form: the whole classifier against one ORT MatMul of its FFN's shape
            dims = f"{b * s.clf_len}x{s.d_model}x{s.ffn}"
            out += ["", f"At batch {b}, ONNX Runtime achieves " + "; ".join(achieved) + f" (one ORT MatMul, {dims})."]
    if any((r.get("others_cpu") or 0) > CONTENDED for r in rows + clf):
        out += ["", f"† measured while other processes used over {CONTENDED:.0%} of the CPUs: not a clean number."]
    return "\n".join(out)


def _mark(*rows: dict | None) -> str:
    """A dagger on a number (or ratio) measured while other processes used the CPUs."""
    return " †" if any(r and (r.get("others_cpu") or 0) > CONTENDED for r in rows) else ""


def contended_cases(results: dict[str, object]) -> list[str]:
    rows = list(results.get("translation") or []) + list(results.get("classifier") or [])  # type: ignore[call-overload]
    same = [
        {**r, "tool": f"{section} {r['tool']}"}
        for section, key in SECTIONS.items()
        for r in (results.get(key) or {}).get("rows", [])  # type: ignore[attr-defined]
    ]
    return [
        f"{r['tool']} batch {r['batch']}" + (f" beam {r['beam']}" if "beam" in r else "") + f" ({r['others_cpu']:.0%})"
        for r in rows + same
        if (r.get("others_cpu") or 0) > CONTENDED
    ]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="bench/engine.py", description=__doc__.split("\n")[0])
    p.add_argument("--tiny", action="store_true", help="tiny shape, for a smoke run")
    p.add_argument("--only", default="", help="comma list of " + ",".join((*SECTIONS, *TOOLS)))
    p.add_argument("--batches", default="1,32")
    p.add_argument("--same-batches", help="batch sizes of the same-model comparison")
    p.add_argument("--same-tools", default=",".join(same_model.TOOLS), help="the same-model comparison's tools")
    p.add_argument(
        "--optimum-path",
        type=Path,
        default=None,
        help="put first on the Optimum runner's PYTHONPATH (default: $BENCH_OPTIMUM_PATH, else <venv>/optimum-onnx)",
    )
    p.add_argument("--beams", default="1,4")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--src-len", type=int, default=0)
    p.add_argument("--new-tokens", type=int, default=0)
    # the timing options default to MEASURE, or to SMOKE with --tiny
    p.add_argument("--min-runs", type=int)
    p.add_argument("--min-time", type=float, help="seconds of timed runs per case and round, at least")
    p.add_argument("--warmup", type=int)
    p.add_argument("--rounds", type=int, help="measure every case this often; report the median")
    p.add_argument("--retries", type=int, help="re-measure a case this often while it is contended")
    p.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "engine.json")
    p.add_argument("--worker", default="", help=argparse.SUPPRESS)  # internal: measure one tool, write rows
    p.add_argument("--worker-out", type=Path, help=argparse.SUPPRESS)
    return p


# Defaults of the options left unset: a measurement, or with --tiny a smoke run (seconds, numbers meaningless)
MEASURE = {"min_runs": 5, "min_time": 1.0, "warmup": 2, "rounds": 3, "retries": 3, "same_batches": "1,8,32"}
SMOKE = {"min_runs": 1, "min_time": 0.0, "warmup": 0, "rounds": 1, "retries": 0, "same_batches": "1,4"}


def parse(argv: list[str]) -> argparse.Namespace:
    args = build_parser().parse_args(argv)
    for name, value in (SMOKE if args.tiny else MEASURE).items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    return args


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse(argv)
    if args.worker:
        rows = measure_tool(args, args.worker)
        args.worker_out.write_text(json.dumps(rows))
        return 0
    try:
        results = run(args)
    except same_model.TokensDiffer as exc:
        print(f"\nFAILED, no speed reported: {exc}", file=sys.stderr)
        return 1
    table = markdown(results)
    results["markdown"] = table
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    busy = results["contention_start"]["training_processes"] or results["contention_end"]["training_processes"]  # type: ignore[index]
    print("\n" + table + "\n")
    if busy:
        print("WARNING: training processes shared the CPU during this run; the numbers are contended.")
    if contended := contended_cases(results):
        print(
            f"WARNING († in the table): other processes used over {CONTENDED:.0%} of the CPUs during: "
            + ", ".join(contended)
        )
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
