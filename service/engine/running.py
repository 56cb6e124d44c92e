"""A running decoder batch: sentences join and leave at any step, each with its own block of rows.

Every active sentence holds a block of `width` consecutive rows (its `Search` decides what they
do). One `step()` runs the decoder graph once for all rows, each row at its own position with
its own past (IO contract 2), then lets each search pick its continuations. Nothing a sentence
sees depends on its neighbours: its past is gathered by `row_index`, padding is masked.

Data kept between steps, and how little of it moves:
- the self-attention cache is the graph's `present` output, fed back as the next `past`; beam
  reorders and leaving rows are a `row_index` gather inside the graph, not numpy copies. A new
  row points at any existing row with an all-zero `past_attention_mask` (masked keys get exactly
  zero weight), so joining copies nothing either;
- cross-attention K/V and the source mask live in preallocated per-row buffers (capacity grows
  by doubling): a joining sentence writes its block; when sentences leave, the blocks after
  them move up to close the gap.
Left padding of the past (a long sentence left) is trimmed when it grows to `TRIM_COLUMNS`;
source columns that are padding for every row, when they reach `SOURCE_SLACK`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar

import numpy as np

from service.contract.graphs import pad
from service.engine.decoding import Hypothesis, Search
from service.engine.runtime import TranslatorRuntime

T = TypeVar("T")
TRIM_COLUMNS = 8  # drop left padding of the past once it is this wide
SOURCE_SLACK = 8  # shrink the source buffer once this many columns are padding for every row


@dataclass(eq=False)
class Block(Generic[T]):
    """One sentence in the batch."""

    tag: T  # the owner's handle for this sentence
    search: Search
    start: int = 0  # first row
    source_len: int = 0


@dataclass
class _Buffers:
    """Per-row cross-attention K/V and source mask, with spare capacity (rows and source columns)."""

    cross: list[np.ndarray] = field(default_factory=list)  # 2L arrays (capacity, H, S_cap, d_k)
    mask: np.ndarray = field(default_factory=lambda: np.zeros((0, 0), np.int64))  # (capacity, S_cap)

    @property
    def capacity(self) -> int:
        return self.mask.shape[0]

    @property
    def columns(self) -> int:
        return self.mask.shape[1]

    def resize(self, rows: int, capacity: int, columns: int, heads: int, d_k: int, layers2: int) -> None:
        """New buffers of this size holding the first `rows` rows (and as many columns as fit)."""
        keep = min(columns, self.columns)
        cross = [np.zeros((capacity, heads, columns, d_k), np.float32) for _ in range(layers2)]
        mask = np.zeros((capacity, columns), np.int64)
        for new, old in zip(cross, self.cross, strict=False):
            new[:rows, :, :keep] = old[:rows, :, :keep]
        mask[:rows, :keep] = self.mask[:rows, :keep]
        self.cross, self.mask = cross, mask


class RunningBatch(Generic[T]):
    """The rows of every active sentence and the decoder inputs kept between steps (not thread-safe:
    one owner thread calls join/step/drop)."""

    def __init__(self, rt: TranslatorRuntime, pad_id: int, timer: Callable[[str, float], None] | None = None) -> None:
        self.rt, self.pad_id, self.timer = rt, pad_id, timer
        self.layers2 = 2 * rt.n_layers
        self.blocks: list[Block[T]] = []
        self.rows = 0
        self.past = self._empty_past()  # the last step's present: 2L arrays (R_prev, H, P, d_k)
        self.row_index = np.zeros(0, np.int64)  # (R,) the row of `past` each row continues
        self.buf = _Buffers()

    def _empty_past(self) -> list[np.ndarray]:
        return [np.zeros((1, self.rt.heads, 0, self.rt.d_k), np.float32)] * self.layers2

    # -- sentences in and out ----------------------------------------------------------------

    def join(self, sources: Sequence[Sequence[int]], searches: Sequence[Search], tags: Sequence[T]) -> None:
        """Adds sentences (source ids with EOS): one encoder run for all of them, then their blocks."""
        if not sources:
            return
        t0 = time.perf_counter()
        ids, mask = pad(sources, self.pad_id)
        cross = self.rt.encode(ids, mask)  # 2L arrays (n, H, S, d_k)
        self._record("encode", time.perf_counter() - t0)
        widths = [s.width for s in searches]
        need = self.rows + sum(widths)
        columns = max(self._source_needed(), ids.shape[1])
        if need > self.buf.capacity or columns > self.buf.columns:
            # rows double only when rows run out: wider sources alone keep the row capacity (the
            # source columns shrink again when long sentences leave, so they come and go often)
            capacity = max(need, 2 * self.buf.capacity, 8) if need > self.buf.capacity else self.buf.capacity
            self.buf.resize(
                self.rows, capacity, max(columns, self.buf.columns), self.rt.heads, self.rt.d_k, self.layers2
            )
        s = ids.shape[1]
        new_index = []
        for i, (search, tag) in enumerate(zip(searches, tags, strict=True)):
            block = Block(tag, search, self.rows, int(mask[i].sum()))
            rows = slice(self.rows, self.rows + search.width)
            for buf, c in zip(self.buf.cross, cross, strict=True):
                buf[rows, :, :s] = c[i]
                buf[rows, :, s:] = 0.0
            self.buf.mask[rows, :s] = mask[i]
            self.buf.mask[rows, s:] = 0
            self.blocks.append(block)
            self.rows += search.width
            new_index.append(np.zeros(search.width, np.int64))  # any row: its past is fully masked
        self.row_index = np.concatenate([self.row_index, *new_index])

    def drop(self, keep: Callable[[T], bool]) -> list[T]:
        """Removes the sentences whose tag `keep` refuses (cancelled, expired); returns their tags."""
        gone = [b for b in self.blocks if not keep(b.tag)]
        self._remove(gone)
        return [b.tag for b in gone]

    # -- one decoder step --------------------------------------------------------------------

    def step(self) -> list[tuple[T, list[Hypothesis]]]:
        """One decoder step for every row; returns the sentences that finished, with their hypotheses."""
        if not self.blocks:
            return []
        t0 = time.perf_counter()
        r = self.rows
        lengths = np.concatenate([np.full(b.search.width, b.search.t, np.int64) for b in self.blocks])  # (R,)
        p = self.past[0].shape[2]
        past_mask = (np.arange(p)[None, :] >= (p - lengths)[:, None]).astype(np.int64)  # (R, P), right-aligned
        tokens = np.concatenate([b.search.tokens for b in self.blocks])
        cross = [c[:r] for c in self.buf.cross]  # leading rows of a C-ordered buffer: no copy
        logp, self.past = self.rt.decode(
            tokens, lengths, self.row_index, past_mask, self.buf.mask[:r], self.past, cross
        )
        next_index = np.empty(r, np.int64)
        finished: list[Block[T]] = []
        for b in self.blocks:
            parents = b.search.advance(logp[b.start : b.start + b.search.width])
            if parents is None:
                finished.append(b)
            else:
                next_index[b.start : b.start + b.search.width] = b.start + parents
        self.row_index = next_index
        self._remove(finished)
        self._trim_past()
        self._record("decode", time.perf_counter() - t0)
        return [(b.tag, b.search.hypotheses()) for b in finished]

    # -- bookkeeping ---------------------------------------------------------------------------

    def _remove(self, gone: Sequence[Block[T]]) -> None:
        """The blocks after each leaving one move up (cross rows, source mask, row_index)."""
        if not gone:
            return
        leaving = set(map(id, gone))
        kept = [b for b in self.blocks if id(b) not in leaving]
        order = sorted(kept, key=lambda b: b.start)
        new_start: dict[int, int] = {}
        pos = 0
        for b in order:
            new_start[id(b)] = pos
            pos += b.search.width
        moves = [(b.start, new_start[id(b)], b.search.width) for b in order if b.start != new_start[id(b)]]
        index = self.row_index.copy()
        for src, dst, w in moves:  # ascending destinations never overwrite a source still to move
            for buf in self.buf.cross:
                buf[dst : dst + w] = buf[src : src + w]
            self.buf.mask[dst : dst + w] = self.buf.mask[src : src + w]
            index[dst : dst + w] = self.row_index[src : src + w]
        for b in order:
            b.start = new_start[id(b)]
        self.blocks, self.rows = order, pos
        self.row_index = index[:pos]
        if not self.blocks:
            self.past, self.row_index = self._empty_past(), np.zeros(0, np.int64)
        elif self.buf.columns - self._source_needed() >= SOURCE_SLACK:
            self.buf.resize(
                self.rows, self.buf.capacity, self._source_needed(), self.rt.heads, self.rt.d_k, self.layers2
            )

    def _trim_past(self) -> None:
        if not self.blocks:
            return
        p = self.past[0].shape[2]
        needed = max(b.search.t for b in self.blocks)
        if p - needed >= TRIM_COLUMNS:
            self.past = [np.ascontiguousarray(a[:, :, p - needed :]) for a in self.past]

    def _source_needed(self) -> int:
        return max((b.source_len for b in self.blocks), default=0)

    def _record(self, stage: str, seconds: float) -> None:
        if self.timer is not None:
            self.timer(stage, seconds)
