"""Greedy and beam search over a model step function: pure numpy, batched, model-agnostic.

The model is reached only through ``step(tokens, state, rows)`` so that decoding can be tested
with a scripted step function and no server (STYLE.md, practice 2). Beam state is kept the
fairseq way: flat ``[A*K]`` rows (A unfinished sentences, K beams each), candidates ranked per
sentence over its ``K*V`` continuations, 2K candidates so beams that end are refilled, and the
length penalty applied when a hypothesis is finalised.

Ties are broken towards the lower (beam, token) index, so results are reproducible and a batch
of N sentences decodes exactly like N single sentences.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

import numpy as np
from numpy.typing import NDArray

S = TypeVar("S")

StepFn = Callable[[np.ndarray, S, np.ndarray], tuple[np.ndarray, S]]
"""``step(tokens, state, rows) -> (logprobs, new_state)``.

tokens: (R,) int64, the last token of each live row.
rows:   (R,) int64, for each live row the row of ``state`` it continues; the step gathers its
        caches by ``rows`` before running, which is how beams are reordered and how finished
        sentences leave the batch.
logprobs: (R, V) float log-probabilities (already log-softmaxed, no NaN).
new_state: R rows, row i being the continuation of ``rows[i]``.
"""

MAX_BEAM_SIZE = 8
# Block count for the top-k threshold: enough blocks that few extra tokens pass it, few enough
# that the per-row maximum over blocks stays a cheap contiguous reduction.
_THRESHOLD_BLOCKS = 512


@dataclass(frozen=True)
class DecodeParams:
    """Everything one decode needs besides the model; validated once, here."""

    beam_size: int = 4  # 1..8; 1 gives greedy's result
    max_new_tokens: int = 128  # generated tokens, EOS included
    length_penalty: float = 1.0  # 0..2; score = logprob / length**length_penalty
    num_hypotheses: int = 1  # 1..beam_size, returned best first

    def __post_init__(self) -> None:
        _check_int("beam_size", self.beam_size, 1, MAX_BEAM_SIZE)
        _check_int("max_new_tokens", self.max_new_tokens, 1, None)
        _check_int("num_hypotheses", self.num_hypotheses, 1, self.beam_size)
        lp = self.length_penalty
        if isinstance(lp, bool) or not isinstance(lp, int | float) or not 0.0 <= lp <= 2.0:
            raise ValueError(f"length_penalty must be a number in [0, 2], got {lp!r}")


@dataclass(frozen=True)
class Hypothesis:
    """One decoded sequence of one sentence."""

    tokens: tuple[int, ...]  # generated ids, without BOS and without EOS
    logprob: float  # sum of token log-probs, EOS included when finished
    score: float  # logprob / length**length_penalty, length = generated tokens incl. EOS
    finished: bool  # ended with EOS (False when cut at max_new_tokens)


def greedy(
    step: StepFn[S],
    state: S,
    bos_id: int,
    eos_id: int,
    max_new_tokens: Sequence[int],
    *,
    length_penalty: float = 1.0,
) -> list[Hypothesis]:
    """Argmax decoding of B = len(max_new_tokens) sentences, one row each in ``state``.

    A sentence leaves the batch as soon as it emits EOS or reaches its own max_new_tokens, so
    later steps run on fewer rows; a max of 0 gives an empty, unfinished hypothesis. The
    length penalty only sets ``score`` (it cannot change an argmax).
    """
    limits = _as_limits(max_new_tokens)
    b = limits.size
    out = np.zeros((b, int(limits.max(initial=0))), dtype=np.int64)  # (B, T) generated ids
    logprob = np.zeros(b)
    length = np.zeros(b, dtype=np.int64)
    finished = np.zeros(b, dtype=bool)

    sent = np.flatnonzero(limits > 0)  # sentence of each live row
    rows = sent.copy()  # row i of the initial state is sentence i
    tokens = np.full(sent.size, bos_id, dtype=np.int64)
    t = 0
    while sent.size:
        logp, state = step(tokens, state, rows)
        logp = _check_logprobs(logp, sent.size)  # (R, V)
        t += 1
        tokens = logp.argmax(axis=1)  # first maximum: lower id wins ties
        logprob[sent] += logp[np.arange(sent.size), tokens]  # float64 sums, as beam_search
        out[sent, t - 1] = tokens
        length[sent] = t
        ended = tokens == eos_id
        finished[sent] = ended
        keep = ~ended & (limits[sent] > t)
        rows = np.flatnonzero(keep)
        sent, tokens = sent[keep], tokens[keep]

    return [
        _hypothesis(
            out[i, : length[i] - finished[i]],
            logprob[i],
            int(length[i]),
            bool(finished[i]),
            length_penalty,
        )
        for i in range(b)
    ]


def beam_search(
    step: StepFn[S],
    state: S,
    bos_id: int,
    eos_id: int,
    params: DecodeParams,
    max_new_tokens: Sequence[int] | None = None,
    *,
    batch_size: int | None = None,
) -> list[list[Hypothesis]]:
    """Beam search over B sentences, one row each in the initial ``state``.

    B is len(max_new_tokens) when given (each value capped by params.max_new_tokens), else
    ``batch_size`` (all sentences use params.max_new_tokens); if both are given they must
    agree. The first step runs on the B rows from BOS; each sentence then keeps K =
    beam_size rows. An EOS among a sentence's K best candidates is finalised (fairseq rule);
    the K best non-EOS candidates continue. A sentence is done, and leaves the batch, when it
    has K finished hypotheses or reaches its max_new_tokens (its live beams are then finalised
    as unfinished). Returns, per sentence, up to ``num_hypotheses`` hypotheses by penalised
    score, best first (fewer only if the vocabulary is too small to supply them). Where fewer
    than K continuations exist (V < 2K, or -inf log-probs) spare rows are dead: score -inf,
    fed EOS, never finalised; they keep the (A, K) layout.
    """
    limits = _beam_limits(params, max_new_tokens, batch_size)
    k = params.beam_size
    lp = params.length_penalty
    hyps: list[list[Hypothesis]] = [[] for _ in range(limits.size)]
    for i in np.flatnonzero(limits == 0):
        hyps[i].append(_hypothesis(np.zeros(0, np.int64), 0.0, 0, False, lp))
    n_finished = np.zeros(limits.size, dtype=np.int64)

    sent = np.flatnonzero(limits > 0)  # (A,) unfinished sentences
    rows = sent.copy()  # row i of the initial state is sentence i
    tokens = np.full(sent.size, bos_id, dtype=np.int64)  # (A*width,)
    cum = np.zeros(sent.size)  # (A*width,) float64 log-prob of each row's prefix
    hist = np.zeros((sent.size, int(limits.max(initial=0))), dtype=np.int64)  # (A*width, T)
    width = 1  # rows per sentence: 1 from BOS, then K
    t = 0
    while sent.size:
        logp, state = step(tokens, state, rows)
        logp = _check_logprobs(logp, rows.size)  # (A*width, V)
        t += 1
        score, row, tok = _top_candidates(logp, cum, width, 2 * k, eos_id)  # (A, 2K) ranked
        is_eos = tok == eos_id

        # fairseq: an EOS among the K best candidates ends that hypothesis.
        for a, j in zip(*np.nonzero(is_eos[:, :k] & np.isfinite(score[:, :k])), strict=True):
            s = sent[a]
            if n_finished[s] < k:
                hyps[s].append(_hypothesis(hist[row[a, j], : t - 1], score[a, j], t, True, lp))
                n_finished[s] += 1

        # Refill: the K best non-EOS candidates continue (stable sort keeps their rank order).
        pick = np.argsort(is_eos, axis=1, kind="stable")[:, :k]  # (A, K)
        live_score = np.take_along_axis(score, pick, axis=1)
        live_row = np.take_along_axis(row, pick, axis=1)
        live_tok = np.take_along_axis(tok, pick, axis=1)
        live_score[np.take_along_axis(is_eos, pick, axis=1)] = -np.inf  # too few: dead beams
        alive = np.isfinite(live_score)

        done = (n_finished[sent] >= k) | ~alive.any(axis=1)
        cut = ~done & (limits[sent] <= t)
        for a in np.flatnonzero(cut):
            for j in np.flatnonzero(alive[a]):
                prefix = np.append(hist[live_row[a, j], : t - 1], live_tok[a, j])
                hyps[sent[a]].append(_hypothesis(prefix, live_score[a, j], t, False, lp))

        keep = ~(done | cut)
        rows = live_row[keep].ravel()  # rows of the state just returned
        tokens = live_tok[keep].ravel()
        cum = live_score[keep].ravel()
        hist = hist[rows]
        hist[:, t - 1] = tokens
        sent = sent[keep]
        width = k

    return [sorted(h, key=lambda x: -x.score)[: params.num_hypotheses] for h in hyps]


def _top_candidates(
    logp: NDArray[np.floating], cum: NDArray[np.float64], width: int, c: int, pad_tok: int
) -> tuple[NDArray[np.float64], NDArray[np.int64], NDArray[np.int64]]:
    """The c best continuations of each sentence, best first: (score, row, token), each (A, c).

    Ranking is by score = cum[row] + logp[row, tok], ties to the lower (row, tok), i.e. the
    lower index into the sentence's (width*V) view. Rather than a top-k over that whole view,
    a per-row threshold that the row's c best tokens are known to pass keeps only a few tokens
    per row; those are ranked exactly. Sentences with fewer than c candidates are padded with
    score -inf, token ``pad_tok`` and the sentence's first row.
    """
    r, v = logp.shape
    n_sent = r // width
    flat = np.flatnonzero(logp >= _row_threshold(logp, c)[:, None])  # into logp.ravel()
    cand_row = flat // v
    cand_score = cum[cand_row] + logp.reshape(-1)[flat]  # float64
    cand_sent = cand_row // width
    order = np.lexsort((flat, -cand_score, cand_sent))  # by sentence, score desc, index
    flat, cand_score, cand_sent = flat[order], cand_score[order], cand_sent[order]
    first = np.searchsorted(cand_sent, np.arange(n_sent))  # first candidate of each sentence
    rank = np.arange(flat.size) - first[cand_sent]
    top = rank < c
    at = (cand_sent[top], rank[top])

    score = np.full((n_sent, c), -np.inf)
    row = np.repeat(np.arange(n_sent, dtype=np.int64) * width, c).reshape(n_sent, c)
    tok = np.full((n_sent, c), pad_tok, dtype=np.int64)
    score[at] = cand_score[top]
    row[at] = flat[top] // v
    tok[at] = flat[top] % v
    return score, row, tok


def _row_threshold(logp: NDArray[np.floating], c: int) -> NDArray[np.floating]:
    """A value per row that at least c of its entries reach, close to its c-th largest.

    The first n*m entries are split into n >= c strided blocks: the c-th largest block maximum
    is reached by c distinct entries, so it is at most the row's c-th largest value. A cheap
    contiguous max plus a partition over n values, instead of an argpartition over all V
    (about 15x slower at V = 8000); the few extra entries that pass are ranked exactly later.
    """
    r, v = logp.shape
    n = min(v, _THRESHOLD_BLOCKS)
    if n < c:
        return np.full(r, -np.inf, dtype=logp.dtype)  # tiny vocabulary: keep everything
    m = v // n
    block_max = logp[:, : n * m].reshape(r, m, n).max(axis=1)  # (R, n), block j: j, j+n, ...
    return np.partition(block_max, n - c, axis=1)[:, n - c]


def _hypothesis(tokens: NDArray[np.integer], logprob: float, length: int, finished: bool, penalty: float) -> Hypothesis:
    """Finalise a sequence: the length penalty is applied once, here."""
    logprob = float(logprob)
    score = logprob / length**penalty if length else logprob
    return Hypothesis(tuple(tokens.tolist()), logprob, score, finished)


def _check_logprobs(logp: np.ndarray, n_rows: int) -> np.ndarray:
    """Fail loudly on a step that returns the wrong number of rows (a row-bookkeeping bug)."""
    logp = np.asarray(logp)
    if logp.ndim != 2 or logp.shape[0] != n_rows or logp.shape[1] == 0:
        raise ValueError(f"step returned logprobs of shape {logp.shape}, expected ({n_rows}, V)")
    return logp


def _as_limits(max_new_tokens: Sequence[int]) -> NDArray[np.int64]:
    limits = np.asarray(max_new_tokens, dtype=np.int64).reshape(-1)
    if (limits < 0).any():
        raise ValueError(f"max_new_tokens must be >= 0 per sentence, got {list(max_new_tokens)}")
    return limits


def _beam_limits(
    params: DecodeParams, max_new_tokens: Sequence[int] | None, batch_size: int | None
) -> NDArray[np.int64]:
    """Per-sentence generation limits; B comes from max_new_tokens or batch_size."""
    if batch_size is not None and (isinstance(batch_size, bool) or batch_size < 0):
        raise ValueError(f"batch_size must be >= 0, got {batch_size!r}")
    if max_new_tokens is None:
        if batch_size is None:
            raise ValueError("beam_search needs max_new_tokens or batch_size to know the batch")
        return np.full(batch_size, params.max_new_tokens, dtype=np.int64)
    limits = _as_limits(max_new_tokens)
    if batch_size is not None and batch_size != limits.size:
        raise ValueError(f"batch_size {batch_size} != len(max_new_tokens) {limits.size}")
    return np.minimum(limits, params.max_new_tokens)


def _check_int(name: str, value: object, lo: int, hi: int | None) -> None:
    if isinstance(value, bool) or not isinstance(value, int | np.integer):
        raise ValueError(f"{name} must be an integer, got {value!r}")
    if value < lo or (hi is not None and value > hi):
        bound = f"[{lo}, {hi}]" if hi is not None else f">= {lo}"
        raise ValueError(f"{name} must be {bound}, got {value}")
