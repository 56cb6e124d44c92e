"""The step scheduler's policy alone: plain data in, a plan out; no threads, no model, no clock."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from service.engine.decoding import DecodeParams, Search
from service.engine.running import Lane, LaneLoad
from service.scheduling.policy import (
    CancelReason,
    Job,
    Plan,
    Sentence,
    StepLimits,
    Usage,
    Wait,
    backlog,
    expected_wait,
    express_request,
    express_time,
    express_turn,
    next_lane,
    plan,
    takes_express,
)

BOS, EOS = 1, 2
IDLE = Usage(rows=0, cache_tokens=0)


def job(widths: Sequence[int], enqueued: float = 9.9, deadline: float = 100.0, limit: int = 9) -> Job:
    """A waiting request of one sentence per width; each sentence reserves 10 cache tokens."""
    j = Job(deadline=deadline, enqueued=enqueued)
    params = [DecodeParams(beam_size=w, num_hypotheses=1, max_new_tokens=limit) for w in widths]
    j.sentences = [Sentence(j, i, [5, EOS], Search(p, BOS, EOS), 9, 10) for i, p in enumerate(params)]
    j.remaining = len(j.sentences)
    j.work = 9 * len(j.sentences)
    return j


def decide(waiting: Sequence[Job], running: Usage = IDLE, now: float = 10.0, **limits: float) -> Plan:
    return plan(waiting, waiting, running, StepLimits(**limits), now)  # type: ignore[arg-type]


def who(p: Plan, *jobs: Job) -> list[tuple[int, int]]:
    """Each admitted sentence as (its job's place in `jobs`, its index)."""
    return [(jobs.index(s.job), s.index) for s in p.admit]


def test_requests_take_turns_one_sentence_each() -> None:
    big, small = job([1, 1, 1]), job([1])
    p = decide([big, small])
    assert who(p, big, small) == [(0, 0), (1, 0), (0, 1), (0, 2)]
    assert p.waiting == [] and p.admitted == {big: 3, small: 1}


def test_the_plan_changes_nothing_it_reads() -> None:
    a, b = job([1, 1]), job([4])
    waiting = [a, b]
    p = decide(waiting, max_rows=2)
    assert who(p, a, b) == [(0, 0), (0, 1)]
    assert waiting == [a, b] and a.admitted == 0 and a.cancelled is None  # the scheduler applies it
    assert p.waiting == [b] and p.admitted == {a: 2}


def test_the_row_budget_passes_over_a_sentence_that_does_not_fit() -> None:
    wide, narrow = job([4]), job([1, 1])
    p = decide([wide, narrow], running=Usage(rows=5, cache_tokens=0), max_rows=8)
    assert who(p, wide, narrow) == [(1, 0), (1, 1)]  # 5 + 4 > 7 rows beams may fill; greedy fits
    assert p.waiting == [wide]
    assert StepLimits(max_rows=4).wide_rows == 3
    # with an express lane, beams fill every main row and short greedy requests have rows of their own
    assert StepLimits(max_rows=4, express_share=0.5).wide_rows == 4
    p = decide([wide, narrow], running=Usage(rows=4, cache_tokens=0, express_rows=6), max_rows=8, express_share=0.5)
    assert who(p, wide, narrow) == [(0, 0), (1, 0), (1, 1)] and p.lanes == [Lane.MAIN, Lane.EXPRESS, Lane.EXPRESS]
    p = decide([wide, narrow], running=Usage(rows=8, cache_tokens=0, express_rows=7), max_rows=8, express_share=0.5)
    assert who(p, wide, narrow) == [(1, 0)]  # the main lane full, the express lane's last row
    assert decide([wide], max_rows=4).admit == wide.sentences  # wider than beams may fill: it runs alone


def test_the_cache_budget_holds_like_the_rows() -> None:
    a = job([1, 1, 1])
    p = decide([a], running=Usage(rows=0, cache_tokens=75), max_cache_tokens=100)
    assert who(p, a) == [(0, 0), (0, 1)]  # 75 + 10 + 10 <= 100 < 75 + 30


def test_a_starving_greedy_sentence_goes_before_anything_else() -> None:
    starving, later = job([1], enqueued=0.0), job([1])
    full = Usage(rows=8, cache_tokens=0)
    assert decide([starving, later], running=full, max_rows=8).admit == []
    p = decide([starving, later], running=Usage(rows=7, cache_tokens=0), max_rows=8)
    assert who(p, starving, later) == [(0, 0)]  # one row freed: the starving one takes it


def test_greedy_sentences_join_a_batch_full_of_beams() -> None:
    """Beams may fill `wide_rows`; the rest is kept for greedy sentences, which join at the next
    step even behind a beam sentence that has waited past `starvation_s` (no other beam may)."""
    limits = {"max_rows": 16, "starvation_s": 0.5}
    assert StepLimits(max_rows=16).wide_rows == 14
    starving, later_beam, greedy = job([4, 4], enqueued=0.0), job([2]), job([1, 1])
    waiting = [starving, later_beam, greedy]
    p = decide(waiting, running=Usage(rows=12, cache_tokens=0), **limits)  # 12 beam rows run: 4 do not fit
    assert [s.job for s in p.admit] == [greedy, greedy]
    p = decide(p.waiting, running=IDLE, **limits)  # the rows freed: it goes first
    assert p.admit[0].job is starving


def test_requests_past_their_deadline_or_cancelled_leave_and_are_not_admitted() -> None:
    expired, cancelled, fine = job([1], deadline=10.0), job([1]), job([1])
    cancelled.cancelled = CancelReason.DISCONNECT
    p = decide([expired, cancelled, fine], now=10.0)
    assert p.admit == fine.sentences and p.evict == [expired, cancelled]
    assert expired.cancelled is None  # the scheduler marks it (deadline)


def test_a_sentence_with_nothing_to_decode_is_passed_over() -> None:
    a = job([1, 1])
    a.sentences[0].search = Search(DecodeParams(beam_size=1), BOS, EOS, limit=0)  # answered without a step
    p = decide([a])
    assert p.admit == [a.sentences[1]] and p.admitted == {a: 2}


def test_sentences_likely_next_are_encoded_with_those_joining() -> None:
    a, b = job([2] * 4), job([2] * 3)
    p = decide([a, b], max_rows=5, encode_ahead=3)
    assert who(p, a, b) == [(0, 0), (1, 0)]
    assert [(s.job is a, s.index) for s in p.encode] == [(True, 0), (False, 0), (True, 1), (False, 1), (True, 2)]
    for s in p.encode:
        s.encoded = object()  # type: ignore[assignment]
    a.admitted, b.admitted = p.admitted[a], p.admitted[b]
    p = decide(p.waiting, running=Usage(rows=2, cache_tokens=0), max_rows=5, encode_ahead=3)
    assert who(p, a, b) == [(0, 1)] and p.encode == []  # encoded already: no run at this step


def test_small_greedy_requests_take_the_express_lane_only_when_it_is_on() -> None:
    on = StepLimits(express_share=0.5, express_work=18)
    small, beams, big = job([1, 1]), job([1, 4]), job([1, 1, 1])  # 9 row-steps a sentence
    assert [takes_express(s, on) for s in small.sentences] == [True, True]
    assert [takes_express(s, on) for s in beams.sentences] == [
        False,
        False,
    ]  # 18 row-steps, but one is a beam: the answer waits for it
    assert not takes_express(big.sentences[0], on)  # 27 row-steps: a batch job, not someone waiting
    assert not takes_express(small.sentences[0], StepLimits())  # off by default


def test_express_steps_take_at_most_their_share_of_the_time() -> None:
    """Express steps of 0.5 ms between main steps of 5 ms: as many as fit in the share."""

    def between(share: float, express_ms: float = 0.5, main_ms: float = 5.0) -> int:
        n, spent = 0, 0.0
        while express_turn(spent, main_ms, share) and n < 1000:
            n, spent = n + 1, spent + express_ms
        return n

    assert between(0.5) == 10  # as much time as the main step
    assert between(0.2) == 3  # 1.25 ms: three steps start within it
    assert between(0.75) == 30
    assert not express_turn(0.0, 0.0, 0.5)  # before any main step: the main batch goes first
    with pytest.raises(ValueError):
        StepLimits(express_share=1.0)


def test_the_plan_names_each_admitted_sentences_lane() -> None:
    small, beams = job([1, 1]), job([4])
    on = {"express_share": 0.5, "express_work": 18}
    assert decide([small, beams], **on).lanes == [Lane.EXPRESS, Lane.MAIN, Lane.EXPRESS]  # round-robin order
    assert set(decide([job([1]), job([4])]).lanes) == {Lane.MAIN}  # no express share: one lane


def test_the_policy_chooses_the_lane_that_steps() -> None:
    """The express lane steps while the main lane is empty, or within its share of the main
    lane's step time; an empty express lane never steps; before any main step, the main lane goes."""
    limits = StepLimits(express_share=0.5)

    def lane(main: int, express: int, express_s: float, main_s: float = 5.0) -> Lane:
        return next_lane(LaneLoad(main, express, express_s, main_s), limits)

    assert lane(main=3, express=0, express_s=0.0) is Lane.MAIN
    assert lane(main=0, express=2, express_s=99.0) is Lane.EXPRESS
    assert lane(main=3, express=2, express_s=4.5) is Lane.EXPRESS  # 4.5 ms of express < 5 ms of main at 0.5
    assert lane(main=3, express=2, express_s=5.0) is Lane.MAIN
    assert lane(main=3, express=2, express_s=0.0, main_s=0.0) is Lane.MAIN
    assert next_lane(LaneLoad(3, 2, 0.0, 5.0), StepLimits()) is Lane.MAIN  # no share: no turn
    # the turns the engine's batch takes alone (`LaneBatch.step()` with `turn`) are the same rule
    for express_s in (0.0, 1.0, 2.4, 2.5, 9.0):
        assert (lane(3, 2, express_s) is Lane.EXPRESS) == express_turn(express_s, 5.0, 0.5)


def test_a_flood_of_short_requests_steps_once_a_main_step_not_by_the_share() -> None:
    """An express lane of a few sentences takes its share of the time (several small steps per main
    step); one of more than `express_few` is a batch in its own right: it steps once after each main
    step, so its rows advance at the main rows' pace instead of at their expense (the think mix's
    beams waited 2-3x the greedy requests with the share). Off, by setting it high, the share rules."""
    limits = StepLimits(express_share=0.5, express_few=8)

    def lane(express: int, express_s: float, main_s: float = 5.0, few: int = 8) -> Lane:
        return next_lane(LaneLoad(3, express, express_s, main_s), StepLimits(express_share=0.5, express_few=few))

    assert lane(express=8, express_s=2.0) is Lane.EXPRESS  # a few: within the share
    assert lane(express=9, express_s=0.0) is Lane.EXPRESS  # many: once after the main step
    assert lane(express=9, express_s=0.1) is Lane.MAIN  # and not again before the next one
    assert lane(express=9, express_s=0.0, main_s=0.0) is Lane.MAIN  # the main lane goes first
    assert lane(express=9, express_s=2.0, few=100) is Lane.EXPRESS  # the share alone
    assert next_lane(LaneLoad(0, 30, 9.0, 5.0), limits) is Lane.EXPRESS  # alone, it steps on
    # admission reads the same rule: a few take the share, many their rows' share of the time
    assert express_time(8, 100, limits) == 0.5
    assert express_time(30, 90, limits) == 30 / 120
    assert express_time(30, 500, limits) == 30 / (30 + 128)  # the main batch steps at most max_rows
    assert express_time(30, 0, limits) == 30 / 31  # an empty main lane: as of the newcomer's row
    many = [costed([1], work=20) for _ in range(12)]  # twelve one-sentence greedy requests, 20 row-steps each
    beams = costed([4], work=100)
    rate, on = 10.0, StepLimits(express_share=0.5, express_work=100, express_few=8)
    short = costed([1], work=20)
    assert estimate([*many, beams], short, on, rate).seconds == (12 * 20 + 20) / (rate * 12 / 16)
    assert estimate([*many[:4], beams], short, on, rate).seconds == (4 * 20 + 20) / (rate * 0.5)
    # a beam request arriving while only the flood runs (the overload check's 500s: a main lane of
    # no rows had no share of the time, and its wait divided by zero)
    assert estimate(many, beams, on, rate).seconds == (100 / (rate * (1 - 12 / 13)))


def costed(widths: Sequence[int], work: int, admitted: int = 0, deadline: float = 100.0) -> Job:
    """`job`, each sentence `work` row-steps, its first `admitted` sentences in the batch."""
    j = job(widths, deadline=deadline)
    for s in j.sentences:
        s.work = work
    j.work, j.admitted = work * len(j.sentences), admitted
    return j


def estimate(jobs: Sequence[Job], new: Job, limits: StepLimits, rate: float) -> Wait:
    """`new`'s wait behind the unanswered `jobs` at `rate` row-steps a second, at time 0."""
    return expected_wait(backlog(jobs, limits, rate, now=0.0), new, limits)


def wait(jobs: Sequence[Job], new: Job, limits: StepLimits, rate: float) -> float:
    return estimate(jobs, new, limits, rate).seconds


def test_a_request_waits_for_its_turns_not_for_the_whole_queue() -> None:
    """Round-robin counted in row-steps: behind a waiting request of five sentences, a request of
    two waits for two of them, then its own; one of six waits for all, as first come first served
    would. Two rows a step: the work, not the steps, bounds the wait here."""
    limits, ahead = StepLimits(max_rows=2), costed([1] * 5, work=100)
    assert wait([ahead], costed([1, 1], work=100), limits, rate=10.0) == (2 * 100 + 200) / 10
    assert wait([ahead], costed([1] * 6, work=100), limits, rate=10.0) == (500 + 600) / 10
    since = expected_wait(backlog([], limits, 10.0, 0.0), costed([1, 1], work=100), limits, since=[ahead])
    assert since.seconds == (2 * 100 + 200) / 10  # admitted since the backlog was built: the same turns
    running = costed([1] * 5, work=100, admitted=3)  # three in the batch: they count whole
    assert wait([running], costed([1], work=100), limits, rate=10.0) == (3 * 100 + 100 + 100) / 10
    running.cancelled = CancelReason.DISCONNECT  # leaves at the next step
    assert wait([running], costed([1], work=100), limits, rate=10.0) == 100 / 10  # its own work


def test_a_short_greedy_request_behind_heavy_beams_is_admitted_and_a_heavy_one_is_not() -> None:
    """The issue's case: three requests of 64 beam-8 sentences, fourteen of them running, fill the
    queue with about 60 s of work; a one-sentence greedy request waits for its 20 steps in the
    express lane (each with at most a full main step: 1.3 s), whatever the queue holds; without the
    express lane it joins the main lane's turns: the running sentences and one of each request's
    waiting ones (5.5 s). Either fits 30 % of a 30 s deadline; first come first served said 64 s.
    A fourth heavy request waits for all of it, as before. The short one crowds nobody: a heavy
    request's own wait (52-61 s of its 120: past 30 %, as when the throughput measured anew is
    lower than at its admission, within 60 %) grows by one short turn."""
    heavy = [costed([8] * 64, work=640, admitted=i, deadline=120.0) for i in (14, 0, 0)]
    queued = sum(j.work for j in heavy)
    short, big, rate = costed([1], work=20), costed([8] * 64, work=640), 2000.0
    express = StepLimits(express_share=0.5)
    assert (queued + short.work) / rate > 60  # the old estimate: refused at any deadline under 200 s
    assert estimate(heavy, short, express, rate) == Wait(20 * 128 / rate, False)  # its steps
    assert wait(heavy, big, express, rate) == (queued + big.work) / rate
    main = StepLimits()
    assert estimate(heavy, short, main, rate) == Wait((14 * 640 + 3 * 640 + 20) / rate, False)  # 5.5 s
    assert wait(heavy, big, main, rate) == (queued + big.work) / rate


def test_a_request_that_would_make_a_waiting_one_late_crowds_it() -> None:
    """Later arrivals take turns from the requests waiting before them: a waiting request of two
    sentences (20 s of its own work) is within 60 % of its 40 s left; one more short turn before its
    last would pass it, so the newcomer crowds it, although its own 20 s fit 30 % of its 100 s.
    With 60 s left it does not; nor when the waiting one is past that share already (20 s of work,
    10 s left: admitted on an idle queue, or measured anew), nor in the other lane, which takes its
    share of the time whatever it holds."""
    limits, rate, new = StepLimits(max_rows=2), 10.0, costed([1], work=100)
    assert estimate([costed([1, 1], work=100, deadline=40.0)], new, limits, rate) == Wait(20.0, True)
    assert not estimate([costed([1, 1], work=100, deadline=60.0)], new, limits, rate).crowds
    assert not estimate([costed([1, 1], work=100, deadline=10.0)], new, limits, rate).crowds
    express = StepLimits(max_rows=2, express_share=0.5, express_work=100)
    small = costed([1, 1], work=50, deadline=40.0)  # in the express lane, which beams do not take turns from
    beams = costed([4], work=100)
    assert express_request(small, express) and not express_request(beams, express)
    assert estimate([small], beams, express, rate) == Wait(100 / (rate * 0.5), False)  # half the time
