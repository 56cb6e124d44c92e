"""DynamicBatcher with a deterministic fake model (y = 2x + 1): no ONNX, no HTTP."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Hashable
from concurrent.futures import ThreadPoolExecutor
from typing import NamedTuple

import pytest

from service.errors import DeadlineExceeded, PayloadTooLarge, QueueFull, ShuttingDown
from service.scheduling.admission import Admission, LoadedSpan
from service.scheduling.batcher import BatchLimits, DynamicBatcher, express_applies, next_batch


class Model:
    """Records every batch it runs; fails a batch holding a negative item."""

    def __init__(self) -> None:
        self.batches: list[list[int]] = []
        self.threads: set[str] = set()
        self.gate = threading.Event()
        self.gate.set()

    def __call__(self, items: list[int]) -> list[int]:
        self.gate.wait(10)
        self.threads.add(threading.current_thread().name)
        self.batches.append(list(items))
        if any(x < 0 for x in items):
            raise ValueError("negative input")
        return [2 * x + 1 for x in items]


class Item(NamedTuple):
    """A waiting item as the batch policy sees it."""

    request: int
    size: int
    key: Hashable = None
    items: int = 1  # its request's items, all


def drain(waiting: list[Item], max_items: int, max_cost: int) -> list[list[Item]]:
    """Every batch `next_batch` forms until nothing waits (no new arrivals)."""
    batches = []
    while waiting:
        picked = next_batch(waiting, max_items, max_cost)
        assert picked, "a batch of nothing while items wait"
        batches.append([waiting[i] for i in picked])
        waiting = [w for i, w in enumerate(waiting) if i not in set(picked)]
    return batches


def run(coro):  # type: ignore[no-untyped-def]
    return asyncio.run(asyncio.wait_for(coro, 20))


def make(model: Model, **limits: float) -> DynamicBatcher[int, int]:
    kw = {"max_batch_size": 8, "max_wait_s": 0.05, "max_queue": 64, "max_batch_cost": 10_000} | limits
    executor = ThreadPoolExecutor(1, thread_name_prefix="fake-model")
    return DynamicBatcher("fake", model, BatchLimits(**kw), size=lambda x: abs(x) % 100 + 1, executor=executor)  # type: ignore[arg-type]


def test_concurrent_items_are_batched_with_exact_answers_in_order() -> None:
    model = Model()

    async def main() -> list[list[int]]:
        b = make(model)
        b.start()
        results = await asyncio.gather(*(b.submit_many([i, i + 100, i + 200]) for i in range(8)))
        await b.close(1)
        return results

    results = run(main())
    assert results == [[2 * i + 1, 2 * i + 201, 2 * i + 401] for i in range(8)]
    assert len(model.batches) < 24 and max(map(len, model.batches)) == 8
    assert model.threads == {"fake-model_0"}  # never the event loop's thread


def test_batch_closes_on_size_before_the_wait() -> None:
    model = Model()

    async def main() -> float:
        b = make(model, max_batch_size=4, max_wait_s=5.0)
        b.start()
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        await asyncio.gather(*(b.submit(i) for i in range(4)))
        await b.close(1)
        return loop.time() - t0

    assert run(main()) < 2.0
    assert model.batches == [[0, 1, 2, 3]]


def test_batch_closes_on_wait_with_one_item() -> None:
    model = Model()

    async def main() -> int:
        b = make(model, max_wait_s=0.02)
        b.start()
        out = await b.submit(5)
        await b.close(1)
        return out

    assert run(main()) == 11 and model.batches == [[5]]


def test_under_load_items_that_arrive_while_the_worker_is_busy_join_the_batch() -> None:
    """Under load the batch is ordered when its wait ends, but its items are chosen when the worker
    is free: where the worker shares a core with the event loop, what arrives meanwhile rides along."""
    model = Model()
    taken = threading.Event()

    async def main() -> list[int]:
        executor = ThreadPoolExecutor(1)
        b: DynamicBatcher[int, int] = DynamicBatcher("fake", model, BatchLimits(max_wait_s=0.01), executor=executor)
        b.start()
        await asyncio.gather(b.submit(10), b.submit(11))  # load: a batch of two
        executor.submit(taken.wait, 10)  # the worker is busy
        first = asyncio.ensure_future(b.submit(1))
        await asyncio.sleep(0.1)  # the wait has ended: the batch is ordered
        rest = [asyncio.ensure_future(b.submit(x)) for x in (2, 3)]
        await asyncio.sleep(0.05)
        taken.set()
        out = [await first, *[await r for r in rest]]
        await b.close(1)
        return out

    assert run(main()) == [3, 5, 7]
    assert model.batches == [[10, 11], [1, 2, 3]]


def test_keys_never_mix_and_others_stay_queued_in_order() -> None:
    model = Model()

    async def main() -> list[int]:
        b: DynamicBatcher[int, int] = DynamicBatcher(
            "fake", model, BatchLimits(8, 0.05, 64, 10_000), key=lambda x: x % 2, executor=None
        )
        b.start()
        out = await asyncio.gather(*(b.submit(i) for i in range(10)))
        await b.close(1)
        return out

    assert run(main()) == [2 * i + 1 for i in range(10)]
    assert model.batches == [[0, 2, 4, 6, 8], [1, 3, 5, 7, 9]]


def test_token_budget_groups_by_length() -> None:
    model = Model()

    async def main() -> None:
        # sizes = x + 1; cost = rows * longest <= 40: short items go together, long ones alone
        b = make(model, max_batch_cost=40, max_wait_s=0.05)
        b.start()
        await asyncio.gather(*(b.submit(x) for x in (1, 30, 2, 31, 3, 4)))
        await b.close(1)

    run(main())
    assert model.batches[0] == [1, 2, 3, 4]
    assert sorted(map(len, model.batches[1:])) == [1, 1]


def test_failing_batch_fails_only_its_own_items() -> None:
    model = Model()

    async def main() -> list[object]:
        b: DynamicBatcher[int, int] = DynamicBatcher(
            "fake", model, BatchLimits(8, 0.05, 64, 10_000), key=lambda x: x < 0, executor=None
        )
        b.start()
        out = await asyncio.gather(b.submit(-1), b.submit(1), b.submit(-2), b.submit(2), return_exceptions=True)
        assert await b.submit(3) == 7  # still serving
        await b.close(1)
        return out

    out = run(main())
    assert out[1] == 3 and out[3] == 5
    assert isinstance(out[0], ValueError) and isinstance(out[2], ValueError)


def test_queue_full_and_deadline_and_shutdown() -> None:
    model = Model()
    model.gate.clear()  # the worker blocks: items pile up

    async def main() -> None:
        b = make(model, max_queue=4, max_wait_s=0.0)
        b.start()
        first = asyncio.ensure_future(b.submit(1))  # runs, blocked on the gate
        await asyncio.sleep(0.1)
        queued = asyncio.ensure_future(b.submit_many([2, 3]))
        expiring = asyncio.ensure_future(b.submit(4, deadline=time.monotonic() - 1))
        await asyncio.sleep(0.05)
        with pytest.raises(QueueFull):
            await b.submit_many([5, 6, 7])  # 2 queued + 3 > 4: all or nothing
        with pytest.raises(DeadlineExceeded):
            await expiring
        late = asyncio.ensure_future(b.submit(8, deadline=time.monotonic() + 0.1))
        with pytest.raises(DeadlineExceeded, match="while queued"):
            await late
        withdrawn = asyncio.ensure_future(b.submit(10))
        await asyncio.sleep(0.01)
        withdrawn.cancel()
        assert b.work == 2 + 3 + 4 + 9 + 11  # sizes: running 1, queued 2 and 3, the expired and withdrawn until dropped
        model.gate.set()
        assert await first == 3 and await queued == [5, 7]
        assert b.work == 0
        await b.close(1)
        with pytest.raises(ShuttingDown):
            await b.submit(9)

    run(main())
    assert [8] not in model.batches  # dropped before it ran


def test_close_lets_admitted_work_finish() -> None:
    model = Model()
    model.gate.clear()

    async def main() -> list[int]:
        b = make(model, max_wait_s=0.0)
        b.start()
        tasks = [asyncio.ensure_future(b.submit(i)) for i in range(3)]
        await asyncio.sleep(0.05)
        closing = asyncio.ensure_future(b.close(5))
        await asyncio.sleep(0.05)
        model.gate.set()
        await closing
        return [await t for t in tasks]

    assert run(main()) == [1, 3, 5]


@pytest.mark.slow
def test_a_lone_client_does_not_wait_after_its_first_batch() -> None:
    model = Model()

    async def main() -> tuple[float, float]:
        b = make(model, max_wait_s=2.0)
        b.start()
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        await b.submit(1)  # nothing known yet: waits for company up to max_wait
        t1 = loop.time()
        await b.submit(2)  # the last batch held 1 item: runs at once
        t2 = loop.time()
        await b.close(1)
        return t1 - t0, t2 - t1

    first, second = run(main())
    assert first >= 1.9 and second < 1.5  # the second did not wait out max_wait


@pytest.mark.slow
def test_no_item_is_left_behind_under_steady_load() -> None:
    """The reproduction of the starvation bug: batch size 4, a 20 ms model, three new items every
    15 ms for 2.25 s (the old batcher lost one of 450). Every item must be answered, within a
    10 s deadline (generous for a loaded machine; a lost item still fails it), with its own result."""

    def slow(items: list[int]) -> list[int]:
        time.sleep(0.02)
        return [2 * x + 1 for x in items]

    async def main() -> list[object]:
        executor = ThreadPoolExecutor(1)
        b: DynamicBatcher[int, int] = DynamicBatcher(
            "fake", slow, BatchLimits(4, 0.001, 4096, 10_000), executor=executor
        )
        b.start()
        calls = []
        for wave in range(150):
            for j in range(3):
                x = 3 * wave + j
                calls.append(asyncio.ensure_future(b.submit(x, deadline=time.monotonic() + 10.0)))
            await asyncio.sleep(0.015)
        out = await asyncio.gather(*calls, return_exceptions=True)
        assert b.work == 0  # every admitted item's size left the count with it
        await b.close(5)
        return out

    out = run(main())
    assert out == [2 * x + 1 for x in range(450)]


def test_work_that_cannot_finish_in_time_is_refused_at_once() -> None:
    """Under overload a request gets a fast 429 (QueueFull with Retry-After), not a 504 after
    waiting: the batcher knows its throughput and the work it has admitted."""

    class Slow(Model):
        def __call__(self, items: list[int]) -> list[int]:
            time.sleep(0.02 * len(items))  # 50 items per second
            return super().__call__(items)

    async def main() -> tuple[float, QueueFull]:
        b = make(Slow(), max_batch_size=1, max_wait_s=0.0, max_queue=1000)
        b.start()
        await b.submit(0)  # one batch measures the throughput
        loop_deadline = time.monotonic() + 10
        backlog = [asyncio.ensure_future(b.submit(0, loop_deadline)) for _ in range(20)]  # 0.4 s of work
        await asyncio.sleep(0)
        t0 = time.monotonic()
        with pytest.raises(QueueFull) as refused:
            await b.submit(0, time.monotonic() + 0.2)  # its deadline: shorter than the backlog
        waited = time.monotonic() - t0
        assert await b.submit(0, time.monotonic() + 10) == 1  # a deadline that allows it: admitted
        await asyncio.gather(*backlog)
        await b.close(1)
        return waited, refused.value

    waited, error = run(main())
    assert waited < 0.2 and error.retry_after is not None and error.retry_after >= 1  # not its deadline


def test_admission_refuses_what_would_not_finish_in_its_share_of_the_deadline() -> None:
    """The refusal both queues share (the batcher's and the step scheduler's), alone."""
    a = Admission("m", max_queue=4, admit_share=0.5, unit="items")
    a.check_time(queued_work=1000, work=1000, time_left=0.001)  # nothing measured yet: admitted
    a.measure(100, 1.0)
    a.measure(200, 1.0)
    assert a.rate == pytest.approx(120.0)  # 0.8 x 100 + 0.2 x 200
    a.check_time(queued_work=0, work=10_000, time_left=0.001)  # an idle queue admits anything
    a.check_time(queued_work=60, work=60, time_left=2.0)  # 1 s of work in half of 2 s
    with pytest.raises(QueueFull, match="busy") as refused:
        a.check_time(queued_work=60, work=61, time_left=2.0)
    assert refused.value.retry_after == 1  # the queued work's time, rounded up
    a.check_room(queued=3, more=1)
    with pytest.raises(QueueFull, match="3 of 4 items"):
        a.check_room(queued=3, more=2)
    with pytest.raises(PayloadTooLarge, match="5 items; model m queues at most 4"):  # never fits: no retry
        a.check_room(queued=0, more=5)


def test_the_loaded_throughput_counts_every_step_since_the_last_full_one() -> None:
    """The step scheduler's measure: small steps (the express lane's) between full ones count
    against the full ones' rows; steps of a batch less than half full measure nothing."""
    span = LoadedSpan(max_rows=64)
    assert span.add(True, 64, 0.010) == (64, 0.010)  # a full step alone
    assert span.add(True, 1, 0.005) is None  # an express step, carried into the next full one
    assert span.add(True, 2, 0.005) is None
    assert span.add(True, 40, 0.010) == (43, pytest.approx(0.020))  # half or more: measured
    assert span.add(True, 1, 0.005) is None
    assert span.add(False, 60, 0.010) is None  # the batch emptied: what was carried is dropped
    assert span.add(True, 32, 0.004) == (32, 0.004)


def test_a_one_item_request_queued_after_256_items_rides_in_the_first_batch() -> None:
    """The fairness first come, first served lacks: a rerank of 256 documents queued before a
    one-text request must not make it wait for all 256 (FCFS: 8 batches of 32)."""
    waiting = [Item(0, 20) for _ in range(256)] + [Item(1, 20)]
    first = next_batch(waiting, max_items=32, max_cost=100_000)
    assert 256 in first and len(first) == 32
    # a share per request under the token budget too: 4 items of 20 tokens fit in 80
    assert sorted(next_batch(waiting, max_items=32, max_cost=80)) == [0, 1, 2, 256]


def test_requests_take_turns_one_item_each_in_the_order_they_came() -> None:
    waiting = [Item(0, 5)] * 4 + [Item(1, 5)] * 2 + [Item(2, 5)]
    batches = drain(waiting, max_items=4, max_cost=1000)
    assert [[w.request for w in b] for b in batches] == [[0, 1, 2, 0], [0, 1, 0]]


def test_the_budget_counts_padded_tokens_and_a_batch_is_sorted_by_length() -> None:
    """Rows x the longest row within the cost; a request's shortest items go first, so its batches
    pad little; an item over the budget runs alone, and nothing is left behind."""
    waiting = [Item(0, n) for n in (30, 4, 12, 3, 500)] + [Item(1, 8)]
    batches = drain(waiting, max_items=32, max_cost=40)
    assert [[w.size for w in b] for b in batches] == [[3, 4, 8], [12], [30], [500]]
    for b in batches[:-1]:
        assert len(b) * max(w.size for w in b) <= 40


def test_a_newcomer_gives_the_item_that_pads_least_not_its_shortest() -> None:
    """Requests still take turns, one item each, but a request past its first turn gives the
    longest item the batch has room for without padding more: an older request's long items left
    and a newcomer's short ones would pad the short ones to the long (its shortest first: 4 rows
    of 30 tokens for 3 of 10, twice the tokens of what they hold)."""
    waiting = [Item(0, n) for n in (30, 31, 32)] + [Item(1, n) for n in (10, 12, 30, 40)]
    first = next_batch(waiting, max_items=2, max_cost=1000)
    assert [waiting[i].size for i in first] == [30, 30]  # not 10 beside 30
    batches = drain(waiting, max_items=32, max_cost=64)
    assert [[(w.request, w.size) for w in b] for b in batches][0] == [(0, 30), (1, 30)]
    assert sorted(w for b in batches for w in b) == sorted(waiting)  # nothing left behind


def test_few_item_requests_batch_alone_while_a_large_one_waits() -> None:
    """With `few`, the requests of at most that many waiting items form the batch alone: a one-text
    request behind a 256-document rerank waits for the batch running only, not also for a full
    batch of rerank items beside its own. Only while both kinds wait; the batcher allows it every
    other batch, so the large request goes on."""
    waiting = [Item(0, 20, None, 256) for _ in range(256)] + [Item(1, 20), Item(2, 20, None, 2), Item(2, 20, None, 2)]
    assert express_applies(waiting, few=8) and not express_applies(waiting, few=0)
    assert sorted(next_batch(waiting, max_items=32, max_cost=512, few=8)) == [256, 257, 258]
    assert len(next_batch(waiting, max_items=32, max_cost=512)) == 25  # round-robin: 512 // 20 items
    alone = [Item(1, 20), Item(2, 20)]
    assert not express_applies(alone, few=8)  # nothing larger waits: one batch for all
    assert not express_applies([Item(0, 5, None, 9)] * 9, few=8)
    # a large request's last few items still make it large: the small one does not ride with them
    tail = [Item(0, 80, None, 256)] * 3 + [Item(1, 18)]
    assert express_applies(tail, few=8) and [tail[i] for i in next_batch(tail, 32, 512, few=8)] == [Item(1, 18)]


def small_behind_large(model: Model, smalls: int, **limits: float) -> tuple[list[int], bool]:
    """64 items submitted together while the worker holds the first batch, then `smalls` one-item
    requests; the worker let go: the small requests' answers, and whether the large one was done by
    then (`model.batches` holds the batches)."""
    model.gate.clear()  # the first batch waits in the worker: everything is queued meanwhile

    async def main() -> tuple[list[int], bool]:
        b = make(model, max_batch_size=8, max_wait_s=0.001, **limits)
        b.start()
        large = asyncio.ensure_future(b.submit_many(list(range(1, 65))))
        await asyncio.sleep(0.05)
        small = [asyncio.ensure_future(b.submit(1000 + k)) for k in range(smalls)]
        await asyncio.sleep(0.05)
        model.gate.set()
        out = [await s for s in small]
        early = large.done()
        await large
        await b.close(1)
        return out, early

    return run(main())


def test_the_batcher_runs_few_item_batches_first_within_their_share() -> None:
    """One-text requests queued behind a large one: the first batch after them is theirs alone
    (FCFS or round-robin: beside 7 of the large one's items), and the batch after it carries the
    large one's items again: few-item batches take at most `express_share` of the time."""
    model = Model()
    assert small_behind_large(model, 3, express_items=1)[0] == [2001, 2003, 2005]
    batches = model.batches
    first = next(i for i, batch in enumerate(batches) if any(x >= 1000 for x in batch))
    assert sorted(batches[first]) == [1000, 1001, 1002]  # theirs alone
    assert all(x < 1000 for x in batches[first + 1]) and len(batches[first + 1]) == 8
    for bad in ({"express_items": -1}, {"express_share": 1.0}, {"shared_batch_cost": -1}):
        with pytest.raises(ValueError):
            BatchLimits(**bad)  # type: ignore[arg-type]


def test_a_large_requests_batches_shrink_while_few_item_ones_come_and_go() -> None:
    """What a one-text request waits for is the batch running when it arrives: while few-item
    requests have waited beside a large one (within `SHARED_WINDOW_S`), the large one's batches
    keep to `shared_batch_cost`; before any came, to `max_batch_cost`."""
    model = Model()
    size = lambda x: abs(x) % 100 + 1  # noqa: E731 (make's)
    small_behind_large(model, 1, express_items=1, shared_batch_cost=40)
    batches = model.batches
    cost = [len(batch) * max(size(x) for x in batch) for batch in batches]
    assert cost[0] > 40  # formed before the small one came: the whole budget
    after = next(i for i, batch in enumerate(batches) if 1000 in batch) + 1
    assert len(batches) > after
    assert all(c <= 40 or len(batch) == 1 for c, batch in zip(cost[after:], batches[after:], strict=True))


def test_only_the_oldest_items_key_and_a_full_batch_stops_at_max_items() -> None:
    waiting = [Item(0, 1, "a"), Item(1, 1, "b"), Item(2, 1, "a"), Item(3, 1, "a")]
    assert next_batch(waiting, max_items=8, max_cost=100) == [0, 2, 3]
    assert next_batch(waiting, max_items=2, max_cost=100) == [0, 2]
    assert next_batch([], max_items=8, max_cost=100) == []


def test_the_oldest_request_advances_in_every_batch_under_a_stream_of_small_ones() -> None:
    """No starvation: new one-item requests arrive before every batch, yet each batch takes an
    item of the oldest request, so the large one finishes."""
    waiting = [Item(0, 10) for _ in range(20)]
    left, n = 20, 1
    for _ in range(20):
        waiting += [Item(n + k, 10) for k in range(6)]  # six new small requests per batch
        n += 6
        picked = next_batch(waiting, max_items=4, max_cost=1000)
        assert any(waiting[i].request == 0 for i in picked)
        left -= sum(waiting[i].request == 0 for i in picked)
        waiting = [w for i, w in enumerate(waiting) if i not in set(picked)]
    assert left == 0


def test_a_small_request_is_answered_before_a_large_one_queued_before_it() -> None:
    """The batcher with the policy: 64 items submitted together, then one: the one is in the
    first batch that runs after it arrived, not behind all 64."""
    model = Model()
    out, early = small_behind_large(model, 1)
    where = [1000 in batch for batch in model.batches]
    assert out == [2001] and not early
    assert where.index(True) <= 1  # FCFS: the ninth batch
