"""Grouping sequences into batches: token-budget batches for training, length-sorted batches for evaluation."""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator, Sequence
from typing import TypeVar

import torch
from torch import Tensor

from service.contract import graphs

R = TypeVar("R")


def pad(seqs: Sequence[Sequence[int]]) -> tuple[Tensor, Tensor]:
    """The contract's batch layout (`service.contract.graphs.pad`) as torch tensors."""
    ids, mask = graphs.pad(seqs)
    return torch.from_numpy(ids), torch.from_numpy(mask)


def token_batches(lengths: Sequence[int], batch_tokens: int, rng: random.Random) -> list[list[int]]:
    """Group examples of similar length so padding stays small; each batch holds ≤ batch_tokens (padded)."""
    order = sorted(range(len(lengths)), key=lambda i: (lengths[i], rng.random()))
    batches, cur, cur_max = [], [], 0
    for i in order:
        new_max = max(cur_max, lengths[i])
        if cur and new_max * (len(cur) + 1) > batch_tokens:
            batches.append(cur)
            cur, new_max = [], lengths[i]
        cur.append(i)
        cur_max = new_max
    if cur:
        batches.append(cur)
    rng.shuffle(batches)
    return batches


class EpochBatches:
    """The training batch stream as a pure function of (seed, step), so a resumed run sees the
    very batches the interrupted one would have: epoch e is shuffled by Random(seed + e)."""

    def __init__(self, lengths: Sequence[int], batch_tokens: int, seed: int) -> None:
        self.lengths, self.batch_tokens, self.seed = list(lengths), batch_tokens, seed

    def epoch(self, e: int) -> list[list[int]]:
        return token_batches(self.lengths, self.batch_tokens, random.Random(self.seed + e))

    def from_step(self, step: int) -> Iterator[list[int]]:
        e = 0
        while True:
            batches = self.epoch(e)
            if step < len(batches):
                yield from batches[step:]
                step = 0
            else:
                step -= len(batches)
            e += 1


def in_length_order(seqs: Sequence[Sequence[int]], batch_size: int, run: Callable[[list[int]], Sequence[R]]) -> list[R]:
    """Runs `run(indices)` on batches of similar length and returns its results in input order."""
    order = sorted(range(len(seqs)), key=lambda i: len(seqs[i]))
    out: list[R | None] = [None] * len(seqs)
    for s in range(0, len(order), batch_size):
        idx = order[s : s + batch_size]
        for i, result in zip(idx, run(idx), strict=True):
            out[i] = result
    return out  # type: ignore[return-value]
