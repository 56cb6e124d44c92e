"""Checks an export must pass before anything is written, and the test-split evaluation of each variant.

ONNX Runtime vs PyTorch max abs difference within a tolerance over several batch sizes, lengths
and past lengths; cached ONNX greedy decoding giving exactly the tokens of uncached PyTorch
decoding. Translator evaluation goes through the service's path: mask spans, decode, restore.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import onnxruntime as ort
import torch
from tokenizers import Tokenizer
from torch import Tensor

from export import metrics
from export.batches import in_length_order
from export.model import Classifier, Translator, greedy, greedy_loop
from export.tokenizer import encode_sources, encode_texts
from service.contract import graphs as io
from service.contract import spans
from service.contract.graphs import pad

FP32_TOL = 1e-4
INT8_LOGIT_TOL = 1.0  # int8 logits move, decisions mostly not; accuracy is measured
FP16_TOL = 5e-2
TOLERANCES = {"fp32": FP32_TOL, "int8": INT8_LOGIT_TOL, "fp16": FP16_TOL}


class ExportError(Exception):
    """The export would produce a model that differs from the checkpoint, or would clobber one."""


def session(path: Path) -> ort.InferenceSession:
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = torch.get_num_threads()
    return ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])


def _t(a: np.ndarray) -> Tensor:
    return torch.from_numpy(a)


def ort_greedy(
    enc: ort.InferenceSession, dec: ort.InferenceSession, model: Translator, src: Sequence[Sequence[int]], max_new: int
) -> list[list[int]]:
    """Cached greedy decoding on the ONNX graphs, every row stepping together (no row dropping)."""
    c = model.config
    n, h, dk = len(model.layers), c.n_heads, c.d_model // c.n_heads
    ids, mask = pad(src)
    cross = dict(zip(io.cross_names(n), enc.run(None, {io.INPUT_IDS: ids, io.ATTENTION_MASK: mask})[1:], strict=True))
    past = [{name: np.zeros((len(src), h, 0, dk), np.float32) for name in io.past_names(n)}]

    def step(prefix: Tensor) -> np.ndarray:
        feed = {io.INPUT_IDS: prefix[:, -1:].numpy(), io.ENCODER_ATTENTION_MASK: mask, **past[0], **cross}
        out = dec.run(None, feed)
        past[0] = dict(zip(io.past_names(n), out[1:], strict=True))
        return out[0]

    return greedy_loop(step, len(src), c.bos_id, c.eos_id, max_new, torch.device("cpu"))


def _cases(seqs: Sequence[list[int]]) -> list[list[list[int]]]:
    """Batches of sizes 1, 3 and 8 with mixed lengths (padding inside a batch), from real sentences."""
    seqs = [s for s in seqs if s] or [[5, 6, 7]]
    return [seqs[:1], seqs[1:4] or seqs[:1], seqs[4:12] or seqs[:1], [max(seqs, key=len)]]


def check_classifier(model: Classifier, path: Path, seqs: Sequence[list[int]], tol: float) -> float:
    sess = session(path)
    worst = 0.0
    for batch in _cases(seqs):
        ids, mask = pad(batch)
        ref = model(_t(ids), _t(mask)).detach().numpy()
        got = sess.run([io.LOGITS], {io.INPUT_IDS: ids, io.ATTENTION_MASK: mask})[0]
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
        t_ids, t_mask = _t(ids), _t(mask)
        memory = model.encode(t_ids, t_mask)
        cross_t = model.cross_kv(memory)
        ref_enc = [memory] + [t for kv in cross_t for t in kv]
        got_enc = enc.run(None, {io.INPUT_IDS: ids, io.ATTENTION_MASK: mask})
        for r, g in zip(ref_enc, got_enc, strict=True):
            worst = max(worst, float(np.abs(r.detach().numpy() - g).max()))
        cross = dict(zip(io.cross_names(n), got_enc[1:], strict=True))
        prefix = _t(np.array([[c.bos_id] + list(range(10, 16))] * len(batch), dtype=np.int64))
        for past_len in (0, 1, 4, 6):
            ref_logits, ref_past = model.decode(
                prefix[:, : past_len + 1], model.empty_past(len(batch)), cross_t, t_mask
            )
            ref = torch.log_softmax(ref_logits[:, -1], -1).detach().numpy()
            _, past = model.decode(prefix[:, :past_len], model.empty_past(len(batch)), cross_t, t_mask)
            feed = {io.INPUT_IDS: prefix[:, past_len : past_len + 1].numpy(), io.ENCODER_ATTENTION_MASK: mask, **cross}
            feed.update(zip(io.past_names(n), [t.detach().numpy() for kv in past for t in kv], strict=True))
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
        ref = greedy(model, _t(ids), _t(mask), max_new, cached=False)
        got = ort_greedy(enc, dec, model, batch, max_new)
        same += sum(a == b for a, b in zip(ref, got, strict=True))
    return same / max(1, len(seqs))


def eval_classifier_variant(
    path: Path, tok: Tokenizer, rows: Sequence[dict], labels: Sequence[str], max_len: int
) -> dict[str, float]:
    sess = session(path)
    seqs = encode_texts(tok, [r["text"] for r in rows], max_len)

    def run(idx: list[int]) -> list[int]:
        ids, mask = pad([seqs[i] for i in idx])
        return sess.run([io.LOGITS], {io.INPUT_IDS: ids, io.ATTENTION_MASK: mask})[0].argmax(-1).tolist()

    pred = in_length_order(seqs, 64, run)
    gold = [labels.index(r["label"]) for r in rows]
    return {
        "accuracy": round(metrics.accuracy(gold, pred), 4),
        "macro_f1": round(metrics.macro_f1(gold, pred, len(labels)), 4),
    }


def eval_translator_variant(
    enc_path: Path, dec_path: Path, model: Translator, tok: Tokenizer, rows: Sequence[dict]
) -> dict[str, float]:
    enc, dec = session(enc_path), session(dec_path)
    c = model.config
    seqs, masked = encode_sources(tok, [r["en"] for r in rows], c.max_len)
    outs = in_length_order(seqs, 64, lambda idx: ort_greedy(enc, dec, model, [seqs[i] for i in idx], c.max_len))
    hyps = [spans.unmask(tok.decode(out), m.spans) for out, m in zip(outs, masked, strict=True)]
    return metrics.bleu_chrf(hyps, [r["de"] for r in rows])
