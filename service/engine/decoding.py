"""Greedy, beam and sampling search, one sentence at a time: pure numpy, model-agnostic.

A `Search` is one sentence's decoding state. It occupies a fixed block of `width` rows in every
decoder step (beam_size rows for beam search, 1 for greedy, num_hypotheses for sampling), takes
its rows' log-probabilities and answers which rows continue with which tokens. Because a search
never looks at other sentences, a sentence decodes to the same result alone, in a batch, or
joining a running batch at any step: the step-level scheduler (`service.scheduling.stepper`)
and the batch drivers below (`decode`, `greedy`, `beam_search`) share it.

Beam search is kept the fairseq way: the block's K rows start from BOS with scores
(0, -inf, ..., -inf); candidates are ranked over the block's K*V continuations, 2K of them so
beams that end are refilled; an EOS among the K best is finalised; the length penalty is
applied when a hypothesis is finalised. Ties are broken towards the lower (row, token) index,
so results are reproducible.

The model is reached only through ``step(tokens, state, rows)`` so that decoding can be tested
with a scripted step function and no server (STYLE.md, practice 2).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal, TypeVar

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
_KEEP_ONE = np.zeros(1, dtype=np.int64)  # a greedy row continues itself (read-only by its users)
_KEEP_ONE.flags.writeable = False
# Block count for the top-k threshold: enough blocks that few extra tokens pass it, few enough
# that the per-row maximum over blocks stays a cheap contiguous reduction.
_THRESHOLD_BLOCKS = 512


@dataclass(frozen=True)
class DecodeParams:
    """Everything one sentence's decoding needs besides the model; validated once, here."""

    beam_size: int = 4  # 1..8; 1 is greedy
    max_new_tokens: int = 128  # generated tokens, EOS included
    length_penalty: float = 1.0  # 0..2; score = logprob / length**length_penalty
    num_hypotheses: int = 1  # 1..beam_size (beam); independent samples (sampling)
    sample: bool = False  # draw tokens instead of searching (beam_size must be 1)
    temperature: float = 1.0  # > 0; sampling only
    top_k: int = 0  # 0: no limit; sampling only
    top_p: float = 1.0  # (0, 1]; sampling only
    seed: int = 0  # sampling: the same seed draws the same tokens
    repetition_penalty: float = 1.0  # > 0; a generated token's log-prob is multiplied by it
    no_repeat_ngram_size: int = 0  # 0: off; n: no n-gram occurs twice in a hypothesis

    def __post_init__(self) -> None:
        _check_int("beam_size", self.beam_size, 1, MAX_BEAM_SIZE)
        _check_int("max_new_tokens", self.max_new_tokens, 1, None)
        _check_int("num_hypotheses", self.num_hypotheses, 1, MAX_BEAM_SIZE if self.sample else self.beam_size)
        _check_int("top_k", self.top_k, 0, None)
        _check_int("no_repeat_ngram_size", self.no_repeat_ngram_size, 0, None)
        _check_int("seed", self.seed, 0, None)
        _check_float("length_penalty", self.length_penalty, 0.0, 2.0)
        _check_float("temperature", self.temperature, 0.0, None, low_open=True)
        _check_float("top_p", self.top_p, 0.0, 1.0, low_open=True)
        _check_float("repetition_penalty", self.repetition_penalty, 0.0, None, low_open=True)
        if self.sample and self.beam_size != 1:
            raise ValueError(f"sampling draws independent hypotheses: beam_size must be 1, got {self.beam_size}")

    @property
    def width(self) -> int:
        """Rows the sentence occupies in every decoder step."""
        return self.num_hypotheses if self.sample else self.beam_size


@dataclass(frozen=True)
class Hypothesis:
    """One decoded sequence of one sentence."""

    tokens: tuple[int, ...]  # generated ids, without BOS and without EOS
    logprob: float  # sum of token log-probs, EOS included when finished
    score: float  # logprob / length**length_penalty, length = generated tokens incl. EOS
    finished: bool  # ended with EOS (False when cut at max_new_tokens)

    @property
    def finish_reason(self) -> Literal["eos", "length"]:
        return "eos" if self.finished else "length"


class Search:
    """One sentence: `tokens` are its rows' inputs to the next step; `advance(logp)` takes that
    step's (width, V) log-probabilities and returns for each row the row it continues (its
    parent, within the block), or None once the sentence is done (`hypotheses()` then)."""

    def __init__(self, params: DecodeParams, bos_id: int, eos_id: int, limit: int | None = None) -> None:
        self.params, self.eos_id = params, eos_id
        self.limit = params.max_new_tokens if limit is None else min(limit, params.max_new_tokens)
        self.width = k = params.width
        self.t = 0  # steps taken
        self.tokens = np.full(k, bos_id, dtype=np.int64)  # (K,) each row's last token
        # Beam rows start as one: (0, -inf, ...) so the first step ranks row 0's continuations
        # only. Sampled rows are independent draws from the start.
        self.cum = np.zeros(k) if params.sample else np.array([0.0] + [-np.inf] * (k - 1))
        self.hist = np.zeros((k, self.limit), dtype=np.int64)  # (K, T) generated ids
        self.alive = np.ones(k, dtype=bool)  # sampling: rows that have not ended
        self.found: list[Hypothesis] = []
        self.done = self.limit == 0
        if self.done:
            self.found.append(_hypothesis(np.zeros(0, np.int64), 0.0, 0, False, params.length_penalty))
        self._rng = np.random.default_rng(params.seed) if params.sample else None

    def advance(self, logp: np.ndarray) -> np.ndarray | None:
        logp = _check_logprobs(logp, self.width)
        self.t += 1
        logp = self._penalised(logp)
        parents = self._sample(logp) if self._rng is not None else self._beam(logp)
        if parents is None:
            self.done = True
        return parents

    @property
    def plain(self) -> bool:
        """A beam (greedy: K = 1) without penalties: its step only needs its 2K best candidates,
        which `rank_candidates` finds for every plain sentence of a batch at once."""
        p = self.params
        return self._rng is None and p.repetition_penalty == 1.0 and not p.no_repeat_ngram_size

    def advance_greedy(self, tok: int, logprob: float) -> np.ndarray | None:
        """`advance` for a plain greedy search (width 1) from its row's best token (the lowest id
        among equals) and that token's log-probability: the same decision in a few scalar steps."""
        self.t += 1
        t, lp, score = self.t, self.params.length_penalty, float(self.cum[0]) + logprob
        if tok == self.eos_id:
            self.found.append(_hypothesis(self.hist[0, : t - 1], score, t, True, lp))
        elif t >= self.limit:
            self.found.append(_hypothesis(np.append(self.hist[0, : t - 1], tok), score, t, False, lp))
        else:
            self.hist[0, t - 1] = self.tokens[0] = tok
            self.cum[0] = score
            return _KEEP_ONE
        self.done = True
        return None

    def advance_ranked(self, score: np.ndarray, row: np.ndarray, tok: np.ndarray) -> np.ndarray | None:
        """`advance` for a plain search from its 2K best candidates (`rank_candidates`, rows
        counted within the block): the same decision, without the full log-probabilities."""
        self.t += 1
        parents = self._continue(score, row, tok)
        if parents is None:
            self.done = True
        return parents

    def hypotheses(self) -> list[Hypothesis]:
        """Best first: up to num_hypotheses (fewer only if the vocabulary cannot supply them)."""
        return sorted(self.found, key=lambda h: -h.score)[: self.params.num_hypotheses]

    # -- beam search (greedy is K = 1) ---------------------------------------------------------

    def _beam(self, logp: NDArray[np.floating]) -> np.ndarray | None:
        k = self.width
        score, row, tok = _top_candidates(logp, self.cum, k, 2 * k, self.eos_id)
        return self._continue(score[0], row[0], tok[0])

    def _continue(self, score: np.ndarray, row: np.ndarray, tok: np.ndarray) -> np.ndarray | None:
        """The step after ranking: (2K,) candidates best first (cumulative score, row, token)."""
        k, t, lp = self.width, self.t, self.params.length_penalty
        is_eos = tok == self.eos_id
        # fairseq: an EOS among the K best candidates ends that hypothesis.
        for j in np.flatnonzero(is_eos[:k] & np.isfinite(score[:k])):
            if len(self.found) < k:
                self.found.append(_hypothesis(self.hist[row[j], : t - 1], score[j], t, True, lp))
        # Refill: the K best non-EOS candidates continue (stable sort keeps their rank order).
        pick = np.argsort(is_eos, kind="stable")[:k]
        live_score, live_row, live_tok = score[pick], row[pick], tok[pick]
        live_score[is_eos[pick]] = -np.inf  # too few candidates: dead rows, fed EOS, never finalised
        alive = np.isfinite(live_score)
        if len(self.found) >= k or not alive.any():
            return None
        if t >= self.limit:
            for j in np.flatnonzero(alive):
                prefix = np.append(self.hist[live_row[j], : t - 1], live_tok[j])
                self.found.append(_hypothesis(prefix, live_score[j], t, False, lp))
            return None
        self.hist = self.hist[live_row]
        self.hist[:, t - 1] = live_tok
        self.tokens, self.cum = live_tok, live_score
        return live_row

    # -- sampling ----------------------------------------------------------------------------

    def _sample(self, logp: NDArray[np.floating]) -> np.ndarray | None:
        p, t, rng = self.params, self.t, self._rng
        assert rng is not None
        for r in np.flatnonzero(self.alive):
            tok = _draw(logp[r], p.temperature, p.top_k, p.top_p, rng)
            self.cum[r] += float(logp[r, tok])
            if tok == self.eos_id:
                self.found.append(_hypothesis(self.hist[r, : t - 1], self.cum[r], t, True, p.length_penalty))
                self.alive[r] = False
            else:
                self.hist[r, t - 1] = tok
                self.tokens[r] = tok
        self.tokens[~self.alive] = self.eos_id
        if self.alive.any() and t >= self.limit:
            for r in np.flatnonzero(self.alive):
                self.found.append(_hypothesis(self.hist[r, :t], self.cum[r], t, False, p.length_penalty))
            self.alive[:] = False
        if not self.alive.any():
            return None
        return np.arange(self.width)

    # -- penalties -----------------------------------------------------------------------------

    def _penalised(self, logp: NDArray[np.floating]) -> NDArray[np.floating]:
        """Repetition penalty and n-gram blocking on the rows' own history (a copy when either is on)."""
        p, done = self.params, self.t - 1  # tokens generated before this step
        if (p.repetition_penalty == 1.0 and not p.no_repeat_ngram_size) or done == 0:
            return logp
        logp = np.array(logp, dtype=np.float64)
        n = p.no_repeat_ngram_size
        for r in range(self.width):
            hist = self.hist[r, :done]
            if p.repetition_penalty != 1.0:
                seen = np.unique(hist)
                logp[r, seen] *= p.repetition_penalty  # log-probs are <= 0: a penalty > 1 lowers them
            if n and done >= n - 1:
                logp[r, _banned(hist, n)] = -np.inf
        return logp


def _banned(hist: NDArray[np.int64], n: int) -> list[int]:
    """Tokens that would repeat an n-gram of `hist` after its last n-1 tokens."""
    if n == 1:
        return sorted(set(hist.tolist()))
    tail = hist[len(hist) - (n - 1) :].tolist()
    return [int(hist[i + n - 1]) for i in range(len(hist) - n + 1) if hist[i : i + n - 1].tolist() == tail]


def _draw(logp: NDArray[np.floating], temperature: float, top_k: int, top_p: float, rng: np.random.Generator) -> int:
    """One token from softmax(logp / temperature) restricted to the top_k tokens and the top_p mass."""
    scaled = np.asarray(logp, dtype=np.float64) / temperature
    order = np.argsort(-scaled, kind="stable")
    if top_k:
        order = order[:top_k]
    probs = np.exp(scaled[order] - scaled[order[0]])
    probs /= probs.sum()
    if top_p < 1.0:
        keep = int(np.searchsorted(np.cumsum(probs), top_p) + 1)  # the smallest prefix reaching top_p
        order, probs = order[:keep], probs[:keep] / probs[:keep].sum()
    return int(order[min(int(np.searchsorted(np.cumsum(probs), rng.random(), side="right")), len(order) - 1)])


# -- batch drivers -------------------------------------------------------------------------------


def decode(step: StepFn[S], state: S, searches: Sequence[Search]) -> list[list[Hypothesis]]:
    """Decodes sentences that start together: row i of the initial `state` is sentence i.

    Each sentence occupies `width` consecutive rows; a sentence that is done leaves the batch
    at once, so later steps run on fewer rows.
    """
    live = [i for i, s in enumerate(searches) if not s.done]
    rows = np.concatenate([np.full(searches[i].width, i, dtype=np.int64) for i in live] or [np.zeros(0, np.int64)])
    while live:
        tokens = np.concatenate([searches[i].tokens for i in live])
        logp, state = step(tokens, state, rows)
        logp = _check_logprobs(logp, rows.size)
        keep, next_rows, start = [], [], 0
        for i in live:
            s = searches[i]
            parents = s.advance(logp[start : start + s.width])
            if parents is not None:
                keep.append(i)
                next_rows.append(parents + start)
            start += s.width
        live, rows = keep, np.concatenate(next_rows) if next_rows else np.zeros(0, np.int64)
    return [s.hypotheses() for s in searches]


def greedy(
    step: StepFn[S],
    state: S,
    bos_id: int,
    eos_id: int,
    max_new_tokens: Sequence[int],
    *,
    length_penalty: float = 1.0,
) -> list[Hypothesis]:
    """Argmax decoding of B = len(max_new_tokens) sentences, one row each in ``state``; a max of
    0 gives an empty, unfinished hypothesis. The length penalty only sets ``score``."""
    limits = _as_limits(max_new_tokens)
    params = DecodeParams(beam_size=1, max_new_tokens=max(1, int(limits.max(initial=1))), length_penalty=length_penalty)
    return [h[0] for h in decode(step, state, [Search(params, bos_id, eos_id, int(n)) for n in limits])]


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
    ``batch_size`` (all sentences use params.max_new_tokens); if both are given they must agree.
    """
    limits = _beam_limits(params, max_new_tokens, batch_size)
    return decode(step, state, [Search(params, bos_id, eos_id, int(n)) for n in limits])


# -- candidates ----------------------------------------------------------------------------------


def _top_candidates(
    logp: NDArray[np.floating], cum: NDArray[np.float64], width: int, c: int, pad_tok: int
) -> tuple[NDArray[np.float64], NDArray[np.int64], NDArray[np.int64]]:
    """The c best continuations of each sentence of `width` rows, best first: (score, row, token),
    each (A, c); `rank_candidates` for sentences of one width."""
    n_sent = logp.shape[0] // width
    return rank_candidates(logp, cum, np.full(n_sent, width), np.full(n_sent, c), pad_tok)


def rank_candidates(
    logp: NDArray[np.floating],
    cum: NDArray[np.float64],
    widths: NDArray[np.integer],
    counts: NDArray[np.integer],
    pad_tok: int,
) -> tuple[NDArray[np.float64], NDArray[np.int64], NDArray[np.int64]]:
    """The counts[i] best continuations of sentence i, whose widths[i] rows follow the previous
    sentence's: (score, row, token), each (A, max(counts)), best first.

    Ranking is by score = cum[row] + logp[row, tok], ties to the lower (row, tok), i.e. the
    lower index into the sentence's (width*V) view. Rather than a top-k over that whole view,
    a per-row threshold that the row's best tokens are known to pass keeps only a few tokens
    per row; those are ranked exactly, for every sentence of the batch in one sort. Places
    beyond a sentence's count or candidates hold score -inf, token ``pad_tok`` and the
    sentence's first row.
    """
    v = logp.shape[1]
    n_sent, c = len(widths), int(np.max(counts))
    starts = np.concatenate([[0], np.cumsum(widths)[:-1]]).astype(np.int64)
    sent_of_row = np.repeat(np.arange(n_sent), widths)
    flat = np.flatnonzero(logp >= _row_threshold(logp, c)[:, None])  # into logp.ravel()
    cand_row = flat // v
    cand_score = cum[cand_row] + logp.reshape(-1)[flat]  # float64
    cand_sent = sent_of_row[cand_row]
    order = np.lexsort((flat, -cand_score, cand_sent))  # by sentence, score desc, index
    flat, cand_score, cand_sent = flat[order], cand_score[order], cand_sent[order]
    first = np.searchsorted(cand_sent, np.arange(n_sent))  # first candidate of each sentence
    rank = np.arange(flat.size) - first[cand_sent]
    top = rank < np.asarray(counts)[cand_sent]
    at = (cand_sent[top], rank[top])

    score = np.full((n_sent, c), -np.inf)
    row = np.repeat(starts, c).reshape(n_sent, c)
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


def _check_float(name: str, value: object, lo: float, hi: float | None, *, low_open: bool = False) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or value != value:
        raise ValueError(f"{name} must be a number, got {value!r}")
    if value < lo or (low_open and value == lo) or (hi is not None and value > hi):
        bound = ("(" if low_open else "[") + f"{lo}, " + (f"{hi}]" if hi is not None else "inf)")
        raise ValueError(f"{name} must be in {bound}, got {value}")
