"""Dynamic batching for one-shot models (the classifier): a list of waiting items and an
`asyncio.Event`, drained by one task. Knows nothing about models or HTTP.

A batch starts with the oldest waiting item and closes when `max_batch_size` items of the same
key are waiting or `max_wait_s` after that oldest item arrived, or earlier, as soon as as many
items wait as the key's previous batch ran with: a lone client (previous batch 1) never waits,
while under steady load a batch still fills up to the level it had. Its items are chosen when the
worker thread is free to start it (an item that arrives until then may join), by `next_batch`, a
pure function: round-robin over the waiting requests (each `submit_many` call is one), one item
of each in turn, a request's shortest items first (size ~ tokens), as long as the padded cost
``len(batch) * max(size)`` stays within `max_batch_cost`. So one batch never mixes keys, a
request of 256 items does not hold back the one-item request queued after it (it rides in the
next batch), and nothing starves: every batch takes an item of the oldest request. Every
submitted item is in `_waiting` (or running) from the moment `submit_many` returns control,
where `depth`, deadlines and `close()` see it.

Admission is cost-aware, by the same `Admission` as the step scheduler's: the batcher measures
its throughput (size units per second of model work) and refuses a request (QueueFull, with a
Retry-After) when the work already admitted plus its own would not finish within `admit_share`
of its deadline; so under overload requests get a fast 429 instead of a 504 after waiting.

`run_batch(items) -> results` is synchronous model work: it runs in `executor` (the model's own
worker thread), never on the event loop. A failing batch sets its exception on the futures of
that batch only. An item whose deadline passes while waiting is dropped before it runs
(`DeadlineExceeded`), also when it passes while its batch waits for the worker thread.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import itertools
import logging
import time
from bisect import bisect_left, bisect_right
from collections.abc import Callable, Hashable, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar

from service.errors import DeadlineExceeded, NotReady, ShuttingDown
from service.scheduling.admission import Admission
from service.scheduling.policy import express_turn

log = logging.getLogger(__name__)

T = TypeVar("T")
R = TypeVar("R")


class BatchObserver(Protocol):
    """Hooks for metrics: `queue_depth` is called on the event loop, `batch_started` in the worker."""

    def queue_depth(self, depth: int) -> None: ...

    def batch_started(self, size: int, queue_waits: Sequence[float]) -> None: ...


class _NoObserver:
    def queue_depth(self, depth: int) -> None:
        pass

    def batch_started(self, size: int, queue_waits: Sequence[float]) -> None:
        pass


class Waiting(Protocol):
    """What the batch policy sees of a waiting item."""

    @property
    def request(self) -> int: ...  # the `submit_many` call it came with

    @property
    def key(self) -> Hashable: ...  # items of different keys never share a batch

    @property
    def size(self) -> int: ...  # its cost in a batch (tokens)

    @property
    def items(self) -> int: ...  # its request's items, all (the few-item rule: `express_applies`)


def express_applies(waiting: Sequence[Waiting], few: int) -> bool:
    """Whether the next batch is the few-item requests' own: of the oldest item's key, some
    waiting requests have at most `few` items in all and some more. In all, not waiting: a
    large request's last few items are its longest, and a small one beside them rode a batch
    of them (the slowest one-text requests beside reranks came in a rerank's last 100 ms)."""
    if not waiting or few < 1:
        return False
    sizes = [w.items for w in waiting if w.key == waiting[0].key]
    return min(sizes) <= few < max(sizes)


def next_batch(waiting: Sequence[Waiting], max_items: int, max_cost: int, few: int = 0) -> list[int]:
    """The next batch: indices into `waiting` (arrival order), shortest first. Items of the oldest
    item's key, taken round-robin over their requests (in the order of their oldest item), one
    item of each in turn, while the batch has at most `max_items` and its padded cost (items x
    the longest) stays within `max_cost`. The oldest request's shortest item goes first, alone if
    it is over the cost; at each later turn a request gives its longest item the batch holds
    room for without padding more (at most the batch's longest), else its shortest, and is done
    for this batch when that does not fit. First come, first served would keep a one-item
    request waiting behind every item of a large one queued before it; each request's shortest
    first would pad a newcomer's short items to the long ones older requests have left.
    With `few` (`express_applies`), only the requests of at most `few` waiting items take part: a
    one-text request then waits for the batch running, not also for a full batch of a large one's
    items beside its own (the batcher allows it for a share of the time, so the large one goes on)."""
    if not waiting:
        return []
    key = waiting[0].key
    lines: dict[int, list[int]] = {}
    for i, w in enumerate(waiting):
        if w.key == key:
            lines.setdefault(w.request, []).append(i)
    if express_applies(waiting, few):  # the few-item requests' batch: theirs alone
        lines = {r: line for r, line in lines.items() if waiting[line[0]].items <= few}
    turns = [sorted(line, key=lambda i: waiting[i].size) for line in lines.values()]  # stable
    sizes = [[waiting[i].size for i in line] for line in turns]
    chosen: list[int] = []
    longest = 0
    while turns and len(chosen) < max_items:
        still = []
        for line, size_of in zip(turns, sizes, strict=True):
            if len(chosen) >= max_items:
                break
            below = bisect_right(size_of, longest) if chosen else 0
            at = bisect_left(size_of, size_of[below - 1]) if below else 0  # the first of that size
            size = size_of[at]
            if chosen and (len(chosen) + 1) * max(longest, size) > max_cost:
                continue  # full for this request
            chosen.append(line.pop(at))
            del size_of[at]
            longest = max(longest, size)
            if line:
                still.append((line, size_of))
        turns, sizes = [t for t, _ in still], [z for _, z in still]
    return sorted(chosen, key=lambda i: waiting[i].size)


@dataclass(eq=False)
class _Pending(Generic[T, R]):
    item: T
    future: asyncio.Future[R]
    request: int
    key: Hashable
    size: int
    enqueued: float  # time.monotonic()
    deadline: float | None
    items: int = 1  # its request's items, all
    started: bool = field(default=False)
    ran: Ran | None = None  # its batch, once it ran


@dataclass(frozen=True)
class Ran:
    """The batch an item ran in, for a trace: when the worker ran it, its items and padded size."""

    start_ns: int  # time.time_ns()
    end_ns: int
    items: int
    padded: int  # items x the longest item's size (tokens)


SHARED_WINDOW_S = 2.0
"""Few-item requests waited beside a larger one this recently: its batches keep to `shared_batch_cost`
(at 5 small requests a second, a gap this long comes once in e^10)."""


@dataclass(frozen=True)
class BatchLimits:
    max_batch_size: int = 32
    max_wait_s: float = 0.001
    max_queue: int = 512
    max_batch_cost: int = 512  # padded size units per batch; one oversized item still runs alone
    admit_share: float = 0.5  # admit when the admitted work fits in this share of the time left
    express_items: int = 0  # requests of at most this many waiting items batch alone while a larger one waits,
    express_share: float = 0.5  # for up to this share of the time (`policy.express_turn`): the larger one goes on
    shared_batch_cost: int = 0  # a larger request's batches while few-item ones come and go (0: max_batch_cost)

    def __post_init__(self) -> None:
        if self.max_batch_size < 1 or self.max_queue < 1 or self.max_batch_cost < 1 or self.max_wait_s < 0:
            raise ValueError(f"invalid batch limits {self}")
        if self.express_items < 0 or not 0 <= self.express_share < 1 or self.shared_batch_cost < 0:
            raise ValueError(f"invalid batch limits {self}")
        if not 0 < self.admit_share <= 1:
            raise ValueError(f"invalid batch limits {self}")


class DynamicBatcher(Generic[T, R]):
    def __init__(
        self,
        name: str,
        run_batch: Callable[[list[T]], Sequence[R]],
        limits: BatchLimits,
        *,
        key: Callable[[T], Hashable] = lambda _: None,
        size: Callable[[T], int] = lambda _: 1,
        executor: Executor | None = None,
        observer: BatchObserver | None = None,
    ) -> None:
        self.name, self.run_batch, self.limits = name, run_batch, limits
        self._key, self._size, self._executor = key, size, executor
        self._observer = observer or _NoObserver()
        self._waiting: list[_Pending[T, R]] = []  # arrival order, not yet running
        self._arrived = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._closing = False
        self._last_size: dict[Hashable, int] = {}  # per key: items in its last batch
        self._express = False  # the batch running is the few-item requests' own
        self._express_s = 0.0  # their batches' time since the last other batch
        self._normal_s = 0.0  # the last other batch's time
        self._small_at = -SHARED_WINDOW_S  # when few-item requests last waited beside a larger one
        self._current: list[_Pending[T, R]] = []  # the batch now running
        self._admitted = 0  # the sizes of the items admitted and not finished: what a newcomer waits behind
        self.admission = Admission(name, limits.max_queue, limits.admit_share, "items")  # rate: size units/s
        self.batches = 0  # executed batches (for tests and logs)
        self._requests = itertools.count()  # numbers each `submit_many` call: the policy's requests

    # -- client side -------------------------------------------------------------------------

    @property
    def depth(self) -> int:
        """Items waiting, not yet running."""
        return len(self._waiting)

    @property
    def work(self) -> int:
        """The sizes of the items admitted and not finished (kept as they come and go, not summed
        per request: what the admission of the next one weighs)."""
        return self._admitted

    @property
    def in_flight(self) -> int:
        """Items admitted and not yet finished: waiting or running."""
        return len(self._waiting) + len(self._current)

    async def submit(self, item: T, deadline: float | None = None) -> R:
        """The result for one item; raises QueueFull, ShuttingDown, DeadlineExceeded or the batch's error."""
        return (await self.submit_many([item], deadline))[0]

    async def submit_many(
        self, items: Sequence[T], deadline: float | None = None, ran: list[Ran] | None = None
    ) -> list[R]:
        """Results in input order for items admitted together (all or none: QueueFull); the
        batches they ran in are added to `ran`, if given (a trace reads them).

        The items may run in different batches, mixed with other callers' items. The first
        failure fails the call and withdraws its items that have not run yet.
        """
        if self._closing:
            raise ShuttingDown(f"model {self.name} is shutting down")
        if self._task is None:
            raise NotReady(f"model {self.name} is not started")
        self.admission.check_room(self.depth, len(items))
        now = time.monotonic()
        if deadline is not None and deadline <= now:
            raise DeadlineExceeded("the request deadline passed before it was queued")
        loop = asyncio.get_running_loop()
        request, n = next(self._requests), len(items)
        pending = [
            _Pending(item, loop.create_future(), request, self._key(item), max(1, self._size(item)), now, deadline, n)
            for item in items
        ]
        size = sum(p.size for p in pending)
        if deadline is not None:
            self.admission.check_time(self.work, size, deadline - now)
        self._waiting.extend(pending)
        self._admitted += size
        self._arrived.set()
        self._observer.queue_depth(self.depth)
        futures = [p.future for p in pending]
        # the deadline fails the futures themselves (no wait_for: it costs a task per request)
        timer = loop.call_later(deadline - now, _expire, pending) if deadline is not None else None
        try:
            results = await _results(futures)
            if ran is not None:
                ran.extend(p.ran for p in pending if p.ran is not None)
            return results
        finally:
            if timer is not None:
                timer.cancel()
            for f in futures:
                if not f.done():
                    f.cancel()  # withdrawn: the loop skips it
                elif not f.cancelled():
                    f.exception()  # retrieved: no "exception was never retrieved" noise

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._loop(), name=f"batcher-{self.name}")

    async def close(self, timeout: float) -> None:
        """Stops admitting; admitted items still run for up to `timeout` s; the rest fail with ShuttingDown."""
        self._closing = True
        self._arrived.set()  # the loop may be waiting for arrivals
        if self._task is None:
            return
        try:
            await asyncio.wait_for(asyncio.shield(self._task), timeout)
        except TimeoutError:
            log.warning("batcher %s: %d items unfinished after %.1f s", self.name, self.in_flight, timeout)
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        finally:
            leftovers, self._waiting, self._current = self._current + self._waiting, [], []
            self._admitted = 0
            for p in leftovers:
                if not p.future.done():
                    p.future.set_exception(ShuttingDown(f"model {self.name} shut down before this item ran"))
            self._observer.queue_depth(self.depth)

    # -- the one task ------------------------------------------------------------------------

    async def _loop(self) -> None:
        while True:
            try:
                if await self._step():
                    return
            except Exception:  # a bug here must not leave futures hanging forever
                log.exception("batcher %s: failed to form a batch", self.name)
                for p in self._waiting:
                    if not p.future.done():
                        p.future.set_exception(RuntimeError("internal batching error"))
                self._waiting = []
                self._admitted = sum(p.size for p in self._current)

    async def _step(self) -> bool:
        """Forms and runs one batch; True when closed and nothing is left."""
        self._drop_dead()
        while not self._waiting:
            if self._closing:
                return True
            self._arrived.clear()
            await self._arrived.wait()
            self._drop_dead()
        first = self._waiting[0]
        close_at = first.enqueued + self.limits.max_wait_s
        while not self._closing and not self._full(first.key) and (left := close_at - time.monotonic()) > 0:
            self._arrived.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(left):
                    await self._arrived.wait()
        await self._run_next()
        return False

    def _drop_dead(self) -> None:
        """Removes items nobody awaits (timed out, cancelled) and fails those whose deadline passed."""
        now = time.monotonic()
        keep = []
        for p in self._waiting:
            if p.future.done():
                continue
            if p.deadline is not None and p.deadline <= now:
                p.future.set_exception(DeadlineExceeded("the request deadline passed while queued"))
                continue
            keep.append(p)
        if len(keep) != len(self._waiting):
            self._admitted -= sum(p.size for p in self._waiting) - sum(p.size for p in keep)
            self._waiting = keep
            self._observer.queue_depth(self.depth)

    def _full(self, key: Hashable) -> bool:
        """Enough items of `key` wait: the size limit, or as many as its last batch ran with."""
        target = min(self.limits.max_batch_size, self._last_size.get(key, self.limits.max_batch_size))
        return len(self._waiting) >= target and sum(1 for p in self._waiting if p.key == key) >= target

    def _select(self) -> list[_Pending[T, R]]:
        """Takes the next batch's items out of `_waiting` (`next_batch`)."""
        now = time.monotonic()
        if express_applies(self._waiting, self.limits.express_items):  # few-item requests wait beside a larger one
            self._small_at = now
            self._express = express_turn(self._express_s, self._normal_s, self.limits.express_share)
        else:
            self._express = False
        cost = self.limits.max_batch_cost
        if not self._express and now - self._small_at < SHARED_WINDOW_S:
            cost = min(cost, self.limits.shared_batch_cost or cost)
        few = self.limits.express_items if self._express else 0
        picked = next_batch(self._waiting, self.limits.max_batch_size, cost, few)
        taken = set(picked)
        chosen = [self._waiting[i] for i in picked]
        self._waiting = [p for i, p in enumerate(self._waiting) if i not in taken]
        return chosen

    async def _run_next(self) -> None:
        """Runs the next batch in the worker thread. Under load (the key's previous batch had more
        than one item) a batch the wait closed before it was full gets its items when the worker is
        free to start it: where the worker shares a core with the event loop, it gets the core once
        the loop has taken in what arrived meanwhile, and those items join this batch instead of
        forming a small one after it. A lone client's item goes at once (no round trip)."""
        self._drop_dead()
        if not self._waiting:
            return
        key = self._waiting[0].key
        lazy = not self._full(key) and self._last_size.get(key, 1) > 1
        loop = asyncio.get_running_loop()
        free: asyncio.Future[None] = loop.create_future()
        chosen: concurrent.futures.Future[list[_Pending[T, R]]] = concurrent.futures.Future()
        if not lazy:
            chosen.set_result(self._select())

        began: list[int] = []

        def work() -> tuple[list[_Pending[T, R]], Sequence[R]]:
            if not chosen.done():
                loop.call_soon_threadsafe(_resolve, free)
            items = chosen.result()
            began.append(time.time_ns())
            return self._work(items)

        t0 = time.perf_counter()
        job = loop.run_in_executor(self._executor, work)
        if lazy:
            job.add_done_callback(lambda _: _resolve(free))  # a job the executor dropped must not strand us
            try:
                await free
                if not job.done():
                    self._drop_dead()
                    chosen.set_result(self._select())
            finally:
                if not chosen.done():
                    chosen.set_result([])  # the worker never waits for a choice that will not come
        batch = chosen.result()
        if not batch:
            job.add_done_callback(_retrieve)
            return
        self._last_size[batch[0].key] = len(batch)
        self._current = batch
        self._observer.queue_depth(self.depth)
        try:
            ran, results = await job
            # wall time, waiting for the worker included: on cores shared with other models and
            # the event loop, compute time alone would promise more
            self.admission.measure(sum(p.size for p in ran), time.perf_counter() - t0)
        except Exception as exc:  # a failing batch fails its own items only
            for p in batch:
                if not p.future.done():
                    p.future.set_exception(exc)
        else:
            mark = Ran(began[0], time.time_ns(), len(ran), len(ran) * max((p.size for p in ran), default=0))
            took = (mark.end_ns - mark.start_ns) / 1e9
            if self._express:
                self._express_s += took
            else:
                self._normal_s, self._express_s = took, 0.0
            for p, r in zip(ran, results, strict=True):
                if not p.future.done():
                    p.ran = mark
                    p.future.set_result(r)
            for p in batch:  # not run: the deadline passed while the batch waited for the worker
                if not p.future.done():
                    p.future.set_exception(DeadlineExceeded("the request deadline passed while queued"))
        finally:
            self._current = []
            self._admitted -= sum(p.size for p in batch)

    def _work(self, batch: list[_Pending[T, R]]) -> tuple[list[_Pending[T, R]], Sequence[R]]:
        """In the worker thread: drops items that expired or were withdrawn meanwhile, runs the rest."""
        now = time.monotonic()
        ran = [p for p in batch if (p.deadline is None or p.deadline > now) and not p.future.done()]
        if not ran:
            return [], []
        for p in ran:
            p.started = True
        self._observer.batch_started(len(ran), [now - p.enqueued for p in ran])
        self.batches += 1
        results = self.run_batch([p.item for p in ran])
        if len(results) != len(ran):
            raise RuntimeError(f"run_batch returned {len(results)} results for {len(ran)} items")
        return ran, results


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


def _retrieve(future: asyncio.Future[Any]) -> None:
    if not future.cancelled():
        future.exception()  # read: no "exception was never retrieved" noise


def _expire(pending: Sequence[_Pending[T, R]]) -> None:
    where = "while running" if any(p.started for p in pending) else "while queued"
    for p in pending:
        if not p.future.done():
            p.future.set_exception(DeadlineExceeded(f"the request deadline passed {where}"))


async def _results(futures: Sequence[asyncio.Future[R]]) -> list[R]:
    """The futures' results in order. Not `asyncio.gather`: a gather cancelled with its caller (a
    client gone) keeps a CancelledError nobody reads, logged at shutdown as an error."""
    return [await f for f in futures]
