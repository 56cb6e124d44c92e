"""Whole-batch decoding over a step function: sentences start together and leave when done.

For the decoding tests (hand-written step tables, a brute-force oracle) and the engine
benchmark (uncached step functions of its own). The service decodes in a running batch
(`service.engine.running`); both drive the same search strategies, so a sentence decodes
to the same result here.

The model is reached only through ``step(tokens, state, rows)``, so decoding can be tested
with a scripted step function and no server (STYLE.md, practice 2).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

import numpy as np
from numpy.typing import NDArray

from service.engine.decoding import DecodeParams, Hypothesis, Search, Strategy

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


def decode(step: StepFn[S], state: S, searches: Sequence[Search]) -> list[list[Hypothesis]]:
    """Decodes sentences that start together: row i of the initial `state` is sentence i.

    Each sentence occupies `rows` consecutive rows (a beam: one at its first step, then `width`);
    a sentence that is done leaves the batch at once, so later steps run on fewer rows. Each
    strategy takes its sentences' step at once, as in the running batch.
    """
    live = [i for i, s in enumerate(searches) if not s.done]
    rows = np.concatenate([np.full(searches[i].rows, i, dtype=np.int64) for i in live] or [np.zeros(0, np.int64)])
    while live:
        tokens = np.concatenate([searches[i].tokens for i in live])
        logp, state = step(tokens, state, rows)
        logp = np.asarray(logp)
        if logp.ndim != 2 or logp.shape[0] != rows.size or logp.shape[1] == 0:
            raise ValueError(f"step returned logprobs of shape {logp.shape}, expected ({rows.size}, V)")
        starts = np.cumsum([0] + [searches[i].rows for i in live])[:-1]
        groups: dict[Strategy, list[int]] = {}
        for j, i in enumerate(live):
            groups.setdefault(searches[i].strategy, []).append(j)
        parents: list[np.ndarray | None] = [None] * len(live)
        for strategy, members in groups.items():
            chosen = strategy.step([searches[live[j]] for j in members], logp, starts[members].astype(np.int64))
            for j, p in zip(members, chosen, strict=True):
                parents[j] = p
        keep, next_rows = [], []
        for j, i in enumerate(live):
            p = parents[j]
            if p is not None:
                keep.append(i)
                next_rows.append(p + starts[j])
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
    strategy: Strategy | None = None,
) -> list[list[Hypothesis]]:
    """Beam search over B sentences, one row each in the initial ``state``.

    B is len(max_new_tokens) when given (each value capped by params.max_new_tokens), else
    ``batch_size`` (all sentences use params.max_new_tokens); if both are given they must agree.
    `strategy` overrides the one the parameters choose (a beam of 1 instead of greedy).
    """
    limits = _beam_limits(params, max_new_tokens, batch_size)
    return decode(step, state, [Search(params, bos_id, eos_id, int(n), strategy=strategy) for n in limits])


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
