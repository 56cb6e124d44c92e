"""The step scheduler's progress events over the exact fake runtime (tests/fakes.py): each row's
tokens in order, then its source's hypotheses; the one-shot answer read from the same events;
a reader that goes away frees its rows at the next step."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from typing import Any

import pytest

from service.engine.decoding import DecodeParams, Hypothesis, Search
from service.engine.running import DecoderBatch, LaneBatch, RunningBatch, ShardedBatch
from service.scheduling.progress import Event, Finished, Tokens
from service.scheduling.stepper import Sentence, StepLimits, StepScheduler
from tests.fakes import BOS, EOS, PAD, FakeRuntime, Observer


def started(rt: FakeRuntime, obs: Observer, layout: str = "one") -> StepScheduler:
    """A started scheduler over one running batch, shards stepping on their own threads, or two
    lanes whose turns its policy chooses (no `route` or `turn` given to the batch)."""
    limits = StepLimits(max_rows=16, express_share=0.5 if layout == "lanes" else 0.0, express_work=1000)

    def make_batch() -> DecoderBatch[Sentence]:
        if layout == "sharded":
            return ShardedBatch(rt, rt, 2, PAD)  # type: ignore[arg-type]
        one: RunningBatch[Sentence] = RunningBatch(rt, PAD)  # type: ignore[arg-type]
        return LaneBatch(one, RunningBatch(rt, PAD)) if layout == "lanes" else one  # type: ignore[arg-type]

    s = StepScheduler("fake", make_batch, limits, obs)
    s.start()
    return s


PARAMS = [
    DecodeParams(beam_size=1, max_new_tokens=12),  # greedy
    DecodeParams(beam_size=3, max_new_tokens=12),  # beams: no tokens, its hypotheses when they end
    DecodeParams(beam_size=1, sample=True, num_hypotheses=2, seed=7, max_new_tokens=12),  # two draws
    DecodeParams(beam_size=1, max_new_tokens=3),  # cut at its limit
    DecodeParams(beam_size=1, repetition_penalty=1.5, max_new_tokens=12),  # greedy with a penalty: ranked as a beam
]


def items() -> list[tuple[list[int], Search]]:
    return [([100 + i, 5 + i, EOS], Search(p, BOS, EOS)) for i, p in enumerate(PARAMS)]


@pytest.mark.parametrize("layout", ["one", "sharded", "lanes"])
def test_each_rows_tokens_arrive_in_order_and_make_the_one_shot_answer(layout: str) -> None:
    rt = FakeRuntime(seed=3)

    async def main() -> tuple[list[list[Event]], list[list[Hypothesis]]]:
        s = started(rt, Observer(), layout)
        steps = [events async for events in s.stream(items(), time.monotonic() + 20, tokens=True)]
        one_shot = await s.submit(items(), time.monotonic() + 20)
        await s.close(1)
        return steps, one_shot

    steps, one_shot = asyncio.run(asyncio.wait_for(main(), 30))
    events = [e for step in steps for e in step]
    greedy = [e for e in events if isinstance(e, Tokens) and e.source == 0]
    assert len(greedy) > 1  # published as the steps go (a slow reader reads several publications at once)
    finished = {e.source: e for e in events if isinstance(e, Finished)}
    assert sorted(finished) == list(range(len(PARAMS)))
    assert [finished[i].hypotheses for i in range(len(PARAMS))] == one_shot  # the same answer either way
    pieces: dict[tuple[int, int], list[int]] = {}
    for at, e in enumerate(events):
        if isinstance(e, Tokens):
            assert at < events.index(finished[e.source])  # a source's tokens come before its end
            pieces.setdefault((e.source, e.row), []).extend(e.ids)
    assert {source for source, _ in pieces} == {0, 2, 3}  # greedy and sampled rows; beams and ranked rows: none
    for source in (0, 3):  # greedy: its one row is its hypothesis, EOS aside
        assert tuple(pieces[source, 0]) == one_shot[source][0].tokens
    assert not one_shot[3][0].finished and len(pieces[3, 0]) == 3  # the token cut at the limit is published too
    draws = {tuple(pieces[2, row]) for row in (0, 1)}  # sampled: each row one draw, in any order of score
    assert draws == {h.tokens for h in one_shot[2]}
    # nothing published twice: per row, the pieces are the tokens in the order they were chosen
    assert sum(len(e.ids) for e in events if isinstance(e, Tokens)) == sum(map(len, pieces.values()))


def test_a_one_shot_request_is_woken_once_with_every_event() -> None:
    """Without tokens nothing is published before the end: the reader wakes once, with each
    source's hypotheses (the loop gets one callback a request, as before there were events)."""
    rt = FakeRuntime(seed=5)

    async def main() -> list[list[Event]]:
        s = started(rt, Observer())
        steps = [events async for events in s.stream(items(), time.monotonic() + 20)]
        await s.close(1)
        return steps

    (events,) = asyncio.run(asyncio.wait_for(main(), 30))
    assert sorted(e.source for e in events if isinstance(e, Finished)) == list(range(len(PARAMS)))
    assert not [e for e in events if isinstance(e, Tokens)]


class Stepping(FakeRuntime):
    """Runs a decoder step only when the test allows one (`allow`)."""

    def __init__(self) -> None:
        super().__init__(seed=9)
        self.permits = threading.Semaphore(0)
        self.entered = 0  # steps begun (waiting for their permit or run)

    def allow(self, steps: int) -> None:
        for _ in range(steps):
            self.permits.release()

    def decode(self, *args: Any, **kwargs: Any) -> Any:
        self.entered += 1
        assert self.permits.acquire(timeout=20)
        return super().decode(*args, **kwargs)


def test_a_reader_that_goes_away_frees_its_rows_at_the_next_step() -> None:
    rt = Stepping()
    obs = Observer()
    long = DecodeParams(beam_size=1, max_new_tokens=200)
    sources = [([s, EOS], Search(long, BOS, EOS)) for s in range(100, 103)]

    async def main() -> tuple[int, int]:
        s = started(rt, obs)
        rt.allow(1)
        async with contextlib.aclosing(s.stream(sources, time.monotonic() + 20, tokens=True)) as stream:
            async for events in stream:
                assert [type(e) for e in events] == [Tokens] * 3  # the first step's token of each
                while rt.entered < 2:  # the scheduler is inside the next step
                    await asyncio.sleep(0.001)
                break  # the reader goes away (an SSE client that disconnected)
        rt.allow(1)  # the step under way when it left ends; before the next, its rows leave
        while s.in_flight:
            await asyncio.sleep(0.001)
        rt.allow(5)  # nothing left to step: no permit is taken
        await asyncio.sleep(0.05)
        steps = rt.steps
        await s.close(1)
        return steps, rt.rows[-1]

    steps, last_rows = asyncio.run(asyncio.wait_for(main(), 30))
    assert steps == 2 and last_rows == 3
    assert obs.cancelled_by == {"disconnect": 3}  # counted by the cancellation metric
