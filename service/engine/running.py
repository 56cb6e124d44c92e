"""A running decoder batch: sentences join and leave at any step, each with its own block of rows.

Every active sentence holds a block of `width` consecutive rows (its `Search` decides what they
do; a beam's first step runs one row, widened to `width` after it) and a sentence slot. One
`step()` runs the decoder graph once for all rows, each row at its own position with its own
cache, each sentence's rows folded over one copy of its source (IO contract 6), then lets each
search strategy take its sentences' step at once (one pass over the vocabulary for all greedy
rows, one sort for the candidates of all beams). Nothing a sentence
sees depends on its neighbours: a row attends to its own cache slots only, padding is masked,
and a sentence's folded cross-attention is the same bit for bit whatever the fold's width.

Data kept between steps, in preallocated buffers whose capacity grows by doubling (rows,
sentences, cache slots) or as needed (source columns), so that little of it moves:
- per row, the self-attention cache: row r's keys and values in slots 0 .. t-1 (t: its
  position). The graph writes the step's new key and value into slot t itself (the buffers bound
  to it by `StepBinding`) or returns them to be written here (a graph called without a binding);
  a beam reorder copies just the rows whose parent changed; a joining row needs no copy at all
  (slot contents beyond a row's position are never attended); a beam widening after its first
  step copies its one row to its other rows (and moves the blocks after it: the sentences that
  joined with it, at the end);
- per sentence, its cross-attention K/V and source mask: written once when it joins, whatever
  its number of rows (a beam of 4 reads one copy).
When sentences leave, the blocks after them move up to close the gap, and the last sentence
slots fill the freed ones; source columns (a multiple of `SOURCE_ALIGN`) that no sentence needs
any more are released when they reach `SOURCE_SLACK`, cache slots when at most a quarter of them
is still needed. A batch that empties keeps its buffers for
the sentences that join next, fitted to them as they join. The buffers are numpy arrays
(`_Buffers`), or, on a GPU, values in its memory (`service.engine.device.DeviceBuffers`, the same
operations as small graphs there): the cache never crosses to the host between steps.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Generic, Protocol, TypeVar

import numpy as np

from service.contract.graphs import fold_indices, pad
from service.engine.decoding import FIRST_ROW, Hypothesis, Search, Strategy
from service.engine.device import DeviceBuffers, SourceSlots
from service.engine.lengths import length_groups
from service.engine.runtime import DecoderStep, StepBinding, TranslatorRuntime
from service.priority import lower_priority

T = TypeVar("T")
SOURCE_SLACK = 8  # shrink the source buffer once this many columns are padding for every row
SOURCE_ALIGN = 8  # the source buffer's width is a multiple of this (see `_aligned`)
SLOT_CHUNK = 8  # the fewest cache slots; they double when rows need more (each growth copies the cache)
ENCODE_CALL_TOKENS = 8  # an encoder run's fixed cost in padded tokens' worth (`encode_sources`)
# A beam step's moved rows copy their caches row by row from this many slots each on average (below,
# one fancy-indexed copy of them all is quicker: 64 rows of 4 slots 0.27 against 0.36 ms, of 24 slots
# 1.24 against 0.81 ms; one thread, measured)
ROW_COPY_SLOTS = 8
IDLE_SLOTS = 16  # an idle batch keeps the cache slots of sentences this long (below 4x: up to 32), releases more


def _written(b: Block[Any]) -> int:
    """The cache slots a block's rows hold: one per step taken, and one more (what moves copy and `_fit` keeps)."""
    return b.search.t + 1


def _aligned(columns: int) -> int:
    """The source width for rows needing `columns`: rounded up to `SOURCE_ALIGN`, so a row's
    cross-attention does not depend on how much padding its batch has. ONNX Runtime sums over
    the source in chunks, and a row's last live columns in a partial chunk at the very end are
    summed in another order than amid padding: a sentence of 19 tokens took log-probabilities
    0.14 apart at one step decoding alone (19 columns) and beside a longer one (any width from
    20 to 128 gave one same result; measured), enough to change a token elsewhere. The price is
    the padding: served /translate with short sentences ran at 0.92x the requests/s (measured;
    4 also held every test sentence bit-identical here, at 0.94x, but 8 covers 8-wide kernels)."""
    return -(-columns // SOURCE_ALIGN) * SOURCE_ALIGN


@dataclass(frozen=True)
class Encoded:
    """One sentence's encoder output, ready to join a batch: its cross-attention keys and values
    (2L arrays (H, length, d_k), its own copies: a sentence held for a later step does not keep its
    whole encoder run's output alive) and its source length."""

    cross: list[np.ndarray]
    length: int


def encode_sources(rt: TranslatorRuntime, sources: Sequence[Sequence[int]], pad_id: int) -> list[Encoded]:
    """Encoder runs for `sources`, sentences of similar length together (`length_groups`): the
    encoder's time is its padded tokens' (one thread: 0.065 ms a token, 0.25 ms a run, int8 on
    the 2-vCPU EPYC VM; 32 test sentences of 9 to 38 tokens took 72 ms as one run, 30 in 7). Each
    sentence's part without the padding columns (masked anyway: a sentence's result does not
    depend on the others in its run)."""
    out: dict[int, Encoded] = {}
    for group in length_groups([len(s) for s in sources], ENCODE_CALL_TOKENS):
        ids, mask = pad([sources[i] for i in group], pad_id)
        cross = rt.encode(ids, mask)  # 2L arrays (n, H, S, d_k)
        for row, (i, n) in enumerate(zip(group, mask.sum(axis=1).tolist(), strict=True)):
            out[i] = Encoded([c[row, :, :n].copy() for c in cross], int(n))
    return [out[i] for i in range(len(sources))]


@dataclass(eq=False)
class Block(Generic[T]):
    """One sentence in the batch."""

    tag: T  # the owner's handle for this sentence
    search: Search
    start: int = 0  # first row
    source_len: int = 0
    slot: int = 0  # its place in the per-sentence buffers (cross-attention K/V, source mask)
    rows: int = 0  # rows it holds now: its search's width, or one before a beam's first step


@dataclass
class _Buffers(SourceSlots):
    """The batch's buffers with spare capacity: per row, the self-attention cache (rows, cache
    slots: growing); per sentence, its cross-attention K/V and source mask (sentences, source
    columns: written once, read by all its rows, IO contract 6)."""

    cross: list[np.ndarray] = field(default_factory=list)  # 2L arrays (sentence capacity, H, S_cap, d_k)
    mask: np.ndarray = field(default_factory=lambda: np.zeros((0, 0), np.int64))  # (sentence capacity, S_cap)
    cache: list[np.ndarray] = field(default_factory=list)  # 2L arrays (capacity, H, slots, d_k)

    @property
    def capacity(self) -> int:
        return self.cache[0].shape[0] if self.cache else 0

    @property
    def slots(self) -> int:
        return self.cache[0].shape[2] if self.cache else 0

    def resize_rows(self, rows: int, capacity: int, slots: int, heads: int, d_k: int, layers2: int) -> None:
        """A new cache of this size holding the first `rows` rows (and as many slots as fit)."""
        kept = min(slots, self.slots)
        cache = [np.zeros((capacity, heads, slots, d_k), np.float32) for _ in range(layers2)]
        for new, old in zip(cache, self.cache, strict=False):
            new[:rows, :, :kept] = old[:rows, :, :kept]
        self.cache = cache

    def resize_sources(self, n: int, capacity: int, columns: int, heads: int, d_k: int, layers2: int) -> None:
        """New cross-attention buffers and mask of this size holding the first `n` sentences (and
        as many source columns as fit)."""
        keep = min(columns, self.columns)
        cross = [np.zeros((capacity, heads, columns, d_k), np.float32) for _ in range(layers2)]
        for new, old in zip(cross, self.cross, strict=False):
            new[:n, :, :keep] = old[:n, :, :keep]
        self.cross, self.mask = cross, self._resized_mask(n, capacity, columns)

    def move(self, src: int, dst: int, width: int, slots: int) -> None:
        """Cache rows src.. to dst.. (dst < src: ascending moves never overwrite a row still to move),
        their first `slots` slots (the rest is never read)."""
        for buf in self.cache:
            buf[dst : dst + width, :, :slots] = buf[src : src + width, :, :slots]

    def move_sentence(self, src: int, dst: int) -> None:
        """A sentence's cross-attention K/V and source mask from slot `src` to slot `dst`."""
        for buf in self.cross:
            buf[dst] = buf[src]
        self.mask[dst] = self.mask[src]

    def write(self, slot: int, cross: Sequence[np.ndarray], length: int) -> None:
        """A joining sentence's cross-attention K/V (2L arrays (H, length, d_k)) into its slot,
        zeros beyond `length`; its source mask."""
        for buf, c in zip(self.cross, cross, strict=True):
            buf[slot, :, :length] = c
            buf[slot, :, length:] = 0.0
        self._mark(slot, length)

    def reorder(self, moved: np.ndarray, parents: np.ndarray, needed: int, slots: np.ndarray | None = None) -> None:
        """Rows `moved` take their parents' cache, slots below `needed` (the rest is never read;
        a copy: a parent may move too). With `slots`, each moved row's own count (its sentence's
        tokens so far): when the rows are at different steps, or many slots deep, and no parent
        moves (a beam step's: each parent keeps its row), row by row, each its own slots and no
        temporary (4 requests' rows at 4 different steps: 0.56 against 1.09 ms; measured)."""
        src = parents[moved]
        if slots is not None and slots.size and slots.mean() >= ROW_COPY_SLOTS and not np.isin(src, moved).any():
            for buf in self.cache:
                for dst, parent, n in zip(moved.tolist(), src.tolist(), slots.tolist(), strict=True):
                    buf[dst, :, :n] = buf[parent, :, :n]
            return
        for buf in self.cache:
            buf[moved, :, :needed] = buf[src, :, :needed]

    def store_new(self, positions: np.ndarray, new_kv: Sequence[np.ndarray]) -> None:
        """Each row's new key and value into its slot `positions[row]` (a graph that did not write them)."""
        every = np.arange(len(positions))
        for buf, new in zip(self.cache, new_kv, strict=True):
            buf[every, :, positions] = new[:, :, 0]

    def leading(self, rows: int, sentences: int) -> tuple[list[np.ndarray], list[np.ndarray]]:
        """The cache's leading rows and the cross-attention buffers' leading sentences, as the decoder reads them."""
        return [c[:rows] for c in self.cache], [c[:sentences] for c in self.cross]


class DecoderBatch(Protocol[T]):
    """What a scheduler drives, whatever the batch's layout: `RunningBatch` and `ShardedBatch`.
    One owner thread calls everything; tags are the owner's handles for its sentences."""

    @property
    def rows(self) -> int: ...

    @property
    def stepped_rows(self) -> int:
        """The rows the last `step()` ran (a batch of lanes steps some of its rows)."""

    @property
    def blocks(self) -> Sequence[Block[T]]: ...

    def encode(self, sources: Sequence[Sequence[int]]) -> list[Encoded]: ...

    def join(self, sources: Sequence[Sequence[int]], searches: Sequence[Search], tags: Sequence[T]) -> None: ...

    def join_encoded(self, encoded: Sequence[Encoded], searches: Sequence[Search], tags: Sequence[T]) -> None: ...

    def drop(self, keep: Callable[[T], bool]) -> list[T]: ...

    def step(self) -> list[tuple[T, list[Hypothesis]]]: ...

    def settle(self) -> None:
        """Ends the steps a batch runs on its own between its owner's calls (a sharded batch's)."""

    def close(self) -> None:
        """Releases what the batch holds besides memory (threads)."""


class RunningBatch(Generic[T]):
    """The rows of every active sentence and the decoder inputs kept between steps (not thread-safe:
    one owner thread calls join/step/drop)."""

    def __init__(self, rt: TranslatorRuntime, pad_id: int, timer: Callable[[str, float], None] | None = None) -> None:
        self.rt, self.pad_id, self.timer = rt, pad_id, timer
        self.layers2 = 2 * rt.n_layers
        self.blocks: list[Block[T]] = []
        self.rows = 0  # the rows its sentences hold once under way (their widths): what a scheduler plans with
        self.used = 0  # the rows in the buffers now, what a step runs (fewer before beams' first steps)
        self.stepped_rows = 0
        self.buf: _Buffers | DeviceBuffers = _Buffers() if rt.device_ops is None else DeviceBuffers(rt.device_ops)
        self._bindings: dict[int, StepBinding | None] = {}  # per runtime (id): kept across steps
        self._fold: tuple[np.ndarray, np.ndarray] | None = None  # `_folding` until blocks join, leave or move

    def set_timer(self, timer: Callable[[str, float], None] | None) -> None:
        self.timer = timer

    def close(self) -> None:
        """Nothing to release: one batch runs on its owner's thread."""

    def settle(self) -> None:
        """Nothing runs between steps: one batch runs on its owner's thread."""

    # -- sentences in and out ----------------------------------------------------------------

    def join(self, sources: Sequence[Sequence[int]], searches: Sequence[Search], tags: Sequence[T]) -> None:
        """Adds sentences (source ids with EOS): encoded together (`encode_sources`), then their blocks."""
        if sources:
            self.join_encoded(self.encode(sources), searches, tags)

    def encode(self, sources: Sequence[Sequence[int]]) -> list[Encoded]:
        """Encodes sentences that join now or later (a scheduler may encode ahead)."""
        t0 = time.perf_counter()
        out = encode_sources(self.rt, sources, self.pad_id)
        self._record("encode", time.perf_counter() - t0)
        return out

    def join_encoded(self, encoded: Sequence[Encoded], searches: Sequence[Search], tags: Sequence[T]) -> None:
        """Adds encoded sentences: each writes its block once (cross-attention K/V and source mask)."""
        if not encoded:
            return
        need = self.rows + sum(s.width for s in searches)
        sentences = len(self.blocks) + len(encoded)
        columns = max(self._source_needed(), _aligned(max(e.length for e in encoded)))
        if not self.rows:  # an idle batch: the last sentences' source width and cache slots are not these
            self._fit(columns, IDLE_SLOTS)
        if need > self.buf.capacity:
            self._resize_rows(max(need, 2 * self.buf.capacity, 8), max(self.buf.slots, SLOT_CHUNK))
        if sentences > self.buf.sentence_capacity or columns > self.buf.columns:
            # sentences double only when slots run out: wider sources alone keep the capacity (the
            # source columns shrink again when long sentences leave, so they come and go often)
            held = self.buf.sentence_capacity
            capacity = max(sentences, 2 * held, 8) if sentences > held else held
            self._resize_sources(capacity, max(columns, self.buf.columns))
        for enc, search, tag in zip(encoded, searches, tags, strict=True):
            slot = len(self.blocks)
            self.buf.write(slot, enc.cross, enc.length)
            self.blocks.append(Block(tag, search, self.used, enc.length, slot, search.rows))
            self.used += search.rows
            self.rows += search.width
        self._fold = None

    def drop(self, keep: Callable[[T], bool]) -> list[T]:
        """Removes the sentences whose tag `keep` refuses (cancelled, expired); returns their tags."""
        gone = [b for b in self.blocks if not keep(b.tag)]
        self._remove(gone)
        return [b.tag for b in gone]

    # -- one decoder step --------------------------------------------------------------------

    def step(self) -> list[tuple[T, list[Hypothesis]]]:
        """One decoder step for every row; returns the sentences that finished, with their hypotheses."""
        if not self.blocks:
            self.stepped_rows = 0
            return []
        t0 = time.perf_counter()
        if len(self.blocks) == 1:
            return self._step_alone(self.blocks[0], t0)
        r = self.stepped_rows = self.used
        positions = np.repeat(np.array([b.search.t for b in self.blocks], np.int64), [b.rows for b in self.blocks])
        needed = int(positions.max()) + 1
        tokens = np.concatenate([b.search.tokens for b in self.blocks])
        out = self._decode(tokens, positions, needed, len(self.blocks))
        every = np.arange(r)
        parents = every.copy()
        finished: list[Block[T]] = []
        widened: dict[int, np.ndarray] = {}  # beams after their first step: block (id) -> its rows' parents
        by_strategy: dict[Strategy, list[Block[T]]] = {}
        for b in self.blocks:  # in row order
            by_strategy.setdefault(b.search.strategy, []).append(b)
        for strategy, blocks in by_strategy.items():
            starts = np.array([b.start for b in blocks], np.int64)
            for b, chosen in zip(blocks, strategy.step([b.search for b in blocks], out.logprobs, starts), strict=True):
                if chosen is None:
                    finished.append(b)
                elif len(chosen) != b.rows:
                    widened[id(b)] = chosen
                elif b.rows > 1:  # a row alone continues itself
                    parents[b.start : b.start + b.rows] = b.start + chosen
        finished.sort(key=lambda b: b.start)
        moved = np.flatnonzero(parents != every)
        if moved.size:  # beam rows that continue another row take its cache: the slots written so far
            self.buf.reorder(moved, parents, needed, positions[moved] + 1)
        if widened:
            self._widen(widened, needed)
        self._remove(finished)
        self._record("decode", time.perf_counter() - t0)
        return [(b.tag, b.search.hypotheses()) for b in finished]

    def _step_alone(self, b: Block[T], t0: float) -> list[tuple[T, list[Hypothesis]]]:
        """`step` for one sentence (a lone request's every step): its rows are the batch's, from
        row 0 (a batch's blocks close up when others leave), so the per-block bookkeeping goes."""
        s, r = b.search, b.rows
        assert b.start == 0 and r == self.used
        self.stepped_rows = r
        needed = s.t + 1
        out = self._decode(s.tokens, np.full(r, s.t, np.int64), needed, 1)
        chosen = s.strategy.step([s], out.logprobs, FIRST_ROW)[0]
        if chosen is None:
            self._remove([b])
            self._record("decode", time.perf_counter() - t0)
            return [(b.tag, s.hypotheses())]
        if len(chosen) != r:
            self._widen({id(b): chosen}, needed)
        elif r > 1:
            moved = np.flatnonzero(chosen != np.arange(r))
            if moved.size:  # rows from 0: a row's parent is its index
                self.buf.reorder(moved, chosen, needed)
        self._record("decode", time.perf_counter() - t0)
        return []

    def _decode(self, tokens: np.ndarray, positions: np.ndarray, needed: int, sentences: int) -> DecoderStep:
        """The decoder call for the leading rows and sentences, its new keys in the cache."""
        if needed > self.buf.slots:  # doubling: a sentence of n tokens copies its cache about log2(n) times
            self._resize_rows(self.buf.capacity, max(needed, 2 * self.buf.slots))
        cache, cross = self.buf.leading(len(positions), sentences)
        out = self.rt.decode(
            tokens, positions, self.buf.mask[:sentences], cache, cross, self._folding(), binding=self._binding()
        )
        if not out.written:
            assert isinstance(self.buf, _Buffers)  # device buffers are bound: written in place
            self.buf.store_new(positions, out.new_kv)
        return out

    # -- bookkeeping ---------------------------------------------------------------------------

    def _binding(self) -> StepBinding | None:
        """This batch's binding to its current runtime's decoder (a shard switches between two)."""
        key = id(self.rt)
        if key not in self._bindings:
            self._bindings[key] = self.rt.binding()
        return self._bindings[key]

    def _widen(self, widened: dict[int, np.ndarray], needed: int) -> None:
        """Beams after their first step take their width: each new row copies its parent (the one
        row), and the blocks after them move down (the sentences that joined with them: at the end).
        The capacity was reserved for every sentence's width when it joined; the blocks before the
        first one widening stay as they are."""
        first = next(i for i, b in enumerate(self.blocks) if id(b) in widened)  # blocks in row order
        src = [np.arange(self.blocks[first].start)]
        pos = self.blocks[first].start
        for b in self.blocks[first:]:
            chosen = widened.get(id(b))
            src.append(b.start + chosen if chosen is not None else np.arange(b.start, b.start + b.rows))
            b.start, b.rows = pos, len(src[-1])
            pos += b.rows
        parents = np.concatenate(src)
        # only the rows from the first widening block on move, and they hold few slots: a beam widens
        # after its first step, and the blocks after it joined with it or since (unless a departure's
        # hole took an older one: hence the most any of them holds)
        slots = min(needed, max(_written(b) for b in self.blocks[first:]))
        self.buf.reorder(np.flatnonzero(parents != np.arange(pos)), parents, slots)
        self.used, self._fold = pos, None

    def _folding(self) -> tuple[np.ndarray, np.ndarray]:
        """Which rows are whose (contract 6's fold and unfold), sentences in slot order: made when
        the blocks change, not at every step (about 20 us, 5 % of a one-row int8 step)."""
        if self._fold is None:
            starts, widths = [0] * len(self.blocks), [0] * len(self.blocks)
            for b in self.blocks:
                starts[b.slot], widths[b.slot] = b.start, b.rows
            self._fold = fold_indices(starts, widths)
        return self._fold

    def _remove(self, gone: Sequence[Block[T]]) -> None:
        """The leaving blocks' rows are filled (cache): by the last blocks when they fit the holes,
        else by moving every later block up; their sentence slots by the last sentences."""
        if not gone:
            return
        leaving = set(map(id, gone))
        kept = sorted((b for b in self.blocks if id(b) not in leaving), key=lambda b: b.start)
        holes = sorted(b.slot for b in gone if b.slot < len(kept))
        movers = sorted((b for b in kept if b.slot >= len(kept)), key=lambda b: b.slot)
        for b, slot in zip(movers, holes, strict=True):
            self.buf.move_sentence(b.slot, slot)
            b.slot = slot
        used = sum(b.rows for b in kept)
        if not self._fill_holes(kept, used):
            pos = 0
            for b in kept:
                if b.start != pos:
                    self.buf.move(b.start, pos, b.rows, _written(b))
                    b.start = pos
                pos += b.rows
        kept.sort(key=lambda b: b.start)
        self.blocks, self.used, self._fold = kept, used, None
        self.rows = sum(b.search.width for b in kept)
        # an idle batch keeps its buffers (a fresh array's every page faults on first write) until the next join
        if kept:
            self._fit(self._source_needed(), max(map(_written, kept)))

    def _fit(self, columns: int, slots: int) -> None:
        """Releases source columns beyond `columns` once `SOURCE_SLACK` of them are padding, and cache
        slots once at most a quarter of them hold `slots` (a long sentence left: attend over fewer)."""
        if self.buf.columns - columns >= SOURCE_SLACK:
            self._resize_sources(self.buf.sentence_capacity, columns)
        if self.buf.slots >= 4 * max(slots, SLOT_CHUNK):
            self._resize_rows(self.buf.capacity, 2 * max(slots, SLOT_CHUNK))

    def _fill_holes(self, kept: list[Block[T]], end: int) -> bool:
        """Moves the blocks lying wholly beyond `end` (the rows that remain) into the holes below (a
        sentence leaving from the middle then costs one block's copy, not every later block's);
        False, moving nothing, where they do not fit (a block across the end, or holes too narrow)."""
        stay = [b for b in kept if b.start + b.rows <= end]
        movers = [b for b in kept if b.start >= end]
        if len(stay) + len(movers) != len(kept):
            return False  # a block across the end
        holes, pos = [], 0  # free row ranges below the end, [start, stop)
        for b in stay:
            if b.start > pos:
                holes.append([pos, b.start])
            pos = b.start + b.rows
        if pos < end:
            holes.append([pos, end])
        plan = []
        for b in sorted(movers, key=lambda b: -b.rows):
            hole = next((h for h in holes if h[1] - h[0] >= b.rows), None)
            if hole is None:
                return False
            plan.append((b, hole[0]))
            hole[0] += b.rows
        for b, dst in plan:  # sources lie beyond the end, destinations below it: no overlap
            self.buf.move(b.start, dst, b.rows, _written(b))
            b.start = dst
        return True

    def _resize_rows(self, capacity: int, slots: int) -> None:
        self.buf.resize_rows(self.used, capacity, slots, self.rt.heads, self.rt.d_k, self.layers2)

    def _resize_sources(self, capacity: int, columns: int) -> None:
        self.buf.resize_sources(len(self.blocks), capacity, columns, self.rt.heads, self.rt.d_k, self.layers2)

    def _source_needed(self) -> int:
        return _aligned(max((b.source_len for b in self.blocks), default=0))

    def _record(self, stage: str, seconds: float) -> None:
        if self.timer is not None:
            self.timer(stage, seconds)


class StepError(Exception):
    """A shard's step failed; `finished` holds what the other shards finished in that step (their
    owner answers those and fails the rest, as for any failing step)."""

    def __init__(self, cause: Exception, finished: list[tuple[Any, list[Hypothesis]]]) -> None:
        super().__init__(str(cause))
        self.finished = finished


class ShardedBatch(Generic[T]):
    """Several running batches ("shards") stepped on as many threads, as CTranslate2's workers
    do: each shard's decoder call runs on one core (ONNX Runtime releases the GIL), so large
    batches use every core without the per-operator synchronisation of intra-op threads.
    A joining sentence goes to the shard with the fewest rows and stays there with its cache.
    When only one shard has work (a lone request), it steps on `wide`, the runtime whose decoder
    session uses every thread (its threads spin between calls: with two cores idle, one sentence
    decodes about 1.4x faster in fp32 than on one thread; measured).

    The shards do not wait for each other: the owner steps the first shard at each `step`, and
    every other shard steps on its own pool thread, one step after another, until the owner needs
    the batch still (`settle`: before sentences join or leave, an encoder run, an express step).
    Stepped in lockstep, the shards' decoder calls ended together and their Python then queued
    for the GIL at every step; now one shard's Python overlaps another's decoder call. What a
    pool shard finishes is handed over by the owner's next `step`. The same interface as
    `RunningBatch` (one owner thread)."""

    def __init__(
        self,
        narrow: TranslatorRuntime,
        wide: TranslatorRuntime,
        shards: int,
        pad_id: int,
        timer: Callable[[str, float], None] | None = None,
    ) -> None:
        self.narrow, self.wide = narrow, wide
        self.parts: list[RunningBatch[T]] = [RunningBatch(wide, pad_id, timer) for _ in range(shards)]
        self._pool = ThreadPoolExecutor(shards - 1, "shard", lower_priority)
        self.stepped_rows = 0
        self._runs: dict[int, Future[None]] = {}  # pool shard -> its run of steps
        self._halt = threading.Event()  # pool shards end their runs after the step under way
        self._news = threading.Condition()  # a pool shard ended a step (or its run)
        self._finished: list[Block[T]] = []  # what pool shards finished: the batch's until handed over
        self._pool_rows = 0  # rows the pool shards stepped since the last `step`
        self._error: Exception | None = None  # a failed step, for the next `step` to raise

    @property
    def blocks(self) -> list[Block[T]]:
        """The sentences not handed over yet: those a pool shard finished count until the next `step`."""
        return [b for p in self.parts for b in p.blocks] + self._finished

    def set_timer(self, timer: Callable[[str, float], None] | None) -> None:
        self.settle()
        for p in self.parts:
            p.timer = timer

    @property
    def rows(self) -> int:
        return sum(p.rows for p in self.parts)

    def join(self, sources: Sequence[Sequence[int]], searches: Sequence[Search], tags: Sequence[T]) -> None:
        if sources:
            self.join_encoded(self.encode(sources), searches, tags)

    def encode(self, sources: Sequence[Sequence[int]]) -> list[Encoded]:
        """Several sentences: split into one run per shard on the one-thread encoder, at once
        (32 int8 sentences of 24 tokens: 10.9 ms, against 15.0 ms as one run on two intra-op
        threads; measured); fewer: one run on the wide runtime."""
        self.settle()
        n = len(self.parts)
        if len(sources) < n:
            self.parts[0].rt = self.wide
            return self.parts[0].encode(sources)
        for p in self.parts:
            p.rt = self.narrow
        cut = [len(sources) * i // n for i in range(n + 1)]
        chunks = [sources[a:b] for a, b in zip(cut, cut[1:], strict=False)]
        others = [self._pool.submit(p.encode, c) for p, c in zip(self.parts[1:], chunks[1:], strict=True)]
        try:
            first = self.parts[0].encode(chunks[0])
        finally:
            wait(others)  # every run ends before anything else touches the batch
        return first + [e for f in others for e in f.result()]

    def join_encoded(self, encoded: Sequence[Encoded], searches: Sequence[Search], tags: Sequence[T]) -> None:
        if encoded:
            self.settle()
        rows = [p.rows for p in self.parts]
        chosen: list[list[int]] = [[] for _ in self.parts]
        for i, search in enumerate(searches):
            k = rows.index(min(rows))
            chosen[k].append(i)
            rows[k] += search.width
        for part, idx in zip(self.parts, chosen, strict=True):
            part.join_encoded([encoded[i] for i in idx], [searches[i] for i in idx], [tags[i] for i in idx])

    def drop(self, keep: Callable[[T], bool]) -> list[T]:
        if any(not keep(b.tag) for i in self._runs for b in self.parts[i].blocks):
            self.settle()
        return [tag for p in self.parts for tag in p.drop(keep)]

    def settle(self) -> None:
        """Ends the pool shards' runs after their steps under way: the owner alone touches the
        batch until the next `step` (a failed step is kept for that `step` to raise)."""
        if not self._runs:
            return
        self._halt.set()
        for i in list(self._runs):
            self._end(i)
        self._halt.clear()

    def step(self) -> list[tuple[T, list[Hypothesis]]]:
        if sum(1 for p in self.parts if p.blocks) <= 1:
            self.settle()
            self._raise_failure()
            active = [p for p in self.parts if p.blocks]
            with self._news:
                pooled, self._pool_rows = self._pool_rows, 0
            self.stepped_rows = pooled + sum(p.used for p in active)
            for p in active:
                p.rt = self.wide
            done = self._handed()
            try:
                return done + (active[0].step() if active else [])
            except Exception as exc:  # what the pool shards finished before goes with the error
                raise StepError(exc, done) from exc
        self._launch()
        stepped, own, done = 0, self.parts[0], []
        if own.blocks and self._error is None:
            own.rt = self.narrow
            stepped += own.used
            try:
                done = own.step()
            except Exception as exc:  # its sentences stay, unstepped, for the owner to drop
                self._error = exc
        elif self._runs:  # nothing of its own: until a pool shard ends a step
            with self._news:
                self._news.wait_for(lambda: bool(self._finished) or any(r.done() for r in self._runs.values()), 1.0)
        for i in [i for i, r in self._runs.items() if r.done()]:
            self._end(i)
        with self._news:
            self.stepped_rows, self._pool_rows = stepped + self._pool_rows, 0
        done += self._handed()
        self._raise_failure(done)
        return done

    def _launch(self) -> None:
        """Starts a run of steps for each pool shard that has sentences and none under way."""
        for i, p in enumerate(self.parts[1:], 1):
            if i not in self._runs and p.blocks and self._error is None:
                p.rt = self.narrow
                self._runs[i] = self._pool.submit(self._run, p)

    def _run(self, p: RunningBatch[T]) -> None:
        """A pool shard's steps, one after another, until it has no sentences or the owner halts it."""
        while p.blocks and not self._halt.is_set():
            before, rows = p.blocks, p.used
            finished = p.step()
            alive = set(map(id, p.blocks)) if finished else set()
            with self._news:
                self._finished += [b for b in before if id(b) not in alive] if finished else []
                self._pool_rows += rows
                self._news.notify()

    def _end(self, i: int) -> None:
        try:
            self._runs.pop(i).result()
        except Exception as exc:  # the shard's sentences stay, unstepped, for the owner to drop
            self._error = self._error or exc

    def _handed(self) -> list[tuple[T, list[Hypothesis]]]:
        """What the pool shards finished since the last call, handed over (in the batch no longer)."""
        with self._news:
            finished, self._finished = self._finished, []
        return [(b.tag, b.search.hypotheses()) for b in finished]

    def _raise_failure(self, done: list[tuple[T, list[Hypothesis]]] | None = None) -> None:
        """A failed step fails the batch's step once the other shards stand still: what they
        finished (and `done`, this step's) goes with the error (its owner answers those and fails
        the rest)."""
        if self._error is None:
            return
        self.settle()
        error, self._error = self._error, None
        raise StepError(error, (done or []) + self._handed()) from error

    def close(self) -> None:
        self.settle()
        self._pool.shutdown(wait=False)


class Lane(StrEnum):
    """The two batches of a `LaneBatch`."""

    MAIN = "main"
    EXPRESS = "express"


@dataclass(frozen=True)
class LaneLoad:
    """What a `LaneBatch`'s lanes hold and how long their steps took: what its owner's policy
    chooses the next step's lane from (`service.scheduling.policy.next_lane`)."""

    main: int  # sentences in the main lane
    express: int  # sentences in the express lane
    express_s: float  # the express steps' time since the main lane's last step
    main_s: float  # the main lane's last step


class LaneBatch(Generic[T]):
    """Two batches stepped in turns, as one: sentences sent to `express` (short interactive
    requests) take small steps of their own between the main batch's steps. A sentence behind a
    full batch of beams then finishes in a few steps of one row, each a fraction of a main step,
    instead of taking one main step per token. Rows stay independent (a sentence decodes as it
    would alone in either batch); only the order of the work changes. The same interface as
    `RunningBatch` (one owner thread).

    The batch executes; its owner decides: which lane a joining sentence takes (`join_encoded`'s
    `lanes`) and which lane steps (`step`'s `lane`), from the lanes' `load`, which the batch
    times with `clock`. An owner that passes neither gives the decisions as functions instead:
    `route(tag)` (True: express) and `turn(express seconds since the main step, the main step's
    seconds)` (True: express steps while both have work)."""

    def __init__(
        self,
        main: DecoderBatch[T],
        express: DecoderBatch[T],
        route: Callable[[T], bool] | None = None,
        turn: Callable[[float, float], bool] | None = None,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.main, self.express, self.route, self.turn, self.clock = main, express, route, turn, clock
        self.stepped_rows = 0
        self._express_s = 0.0  # express steps' time since the main batch's last step
        self._main_s = 0.0  # the main batch's last step

    @property
    def rows(self) -> int:
        return self.main.rows + self.express.rows

    @property
    def blocks(self) -> list[Block[T]]:
        return [*self.main.blocks, *self.express.blocks]

    @property
    def load(self) -> LaneLoad:
        return LaneLoad(len(self.main.blocks), len(self.express.blocks), self._express_s, self._main_s)

    def encode(self, sources: Sequence[Sequence[int]]) -> list[Encoded]:
        return self.main.encode(sources)

    def join(self, sources: Sequence[Sequence[int]], searches: Sequence[Search], tags: Sequence[T]) -> None:
        if sources:
            self.join_encoded(self.encode(sources), searches, tags)

    def join_encoded(
        self,
        encoded: Sequence[Encoded],
        searches: Sequence[Search],
        tags: Sequence[T],
        lanes: Sequence[Lane] | None = None,
    ) -> None:
        """Adds sentences to the lanes `lanes` names, one each (none: `route`'s, else the main lane)."""
        if lanes is None:
            route = self.route
            lanes = [Lane.EXPRESS if route is not None and route(t) else Lane.MAIN for t in tags]
        for batch, chosen in ((self.express, Lane.EXPRESS), (self.main, Lane.MAIN)):
            idx = [i for i, x in enumerate(lanes) if x is chosen]
            if idx:
                batch.join_encoded([encoded[i] for i in idx], [searches[i] for i in idx], [tags[i] for i in idx])

    def drop(self, keep: Callable[[T], bool]) -> list[T]:
        return [*self.main.drop(keep), *self.express.drop(keep)]

    def settle(self) -> None:
        self.main.settle()
        self.express.settle()

    def step(self, lane: Lane | None = None) -> list[tuple[T, list[Hypothesis]]]:
        """One step of the lane `lane` (none: as `turn` says); a lane with no sentences steps nothing."""
        if lane is None:
            if self.turn is None:
                raise ValueError("a lane batch without `turn` steps the lane its owner names")
            express = bool(self.express.blocks) and (not self.main.blocks or self.turn(self._express_s, self._main_s))
            lane = Lane.EXPRESS if express else Lane.MAIN
        express = lane is Lane.EXPRESS
        batch = self.express if express else self.main
        if express:  # the express step has the cores: the main batch's shards stand still meanwhile
            self.main.settle()
        t0 = self.clock()
        try:
            return batch.step()
        finally:
            self.stepped_rows = batch.stepped_rows
            took = self.clock() - t0
            if express:
                self._express_s += took
            elif self.stepped_rows:
                self._main_s, self._express_s = took, 0.0

    def close(self) -> None:
        self.main.close()
        self.express.close()
