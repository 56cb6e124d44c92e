"""The step scheduler's policy: which waiting sentences join the running batch at this step,
which requests leave it. Pure: `plan(waiting, jobs, running, limits, now)` reads the queue and
returns a `Plan`, changing nothing, so every rule is unit-tested without threads or a model
(vLLM's scheduler separates deciding from executing the same way). `stepper.StepScheduler`
applies the plan and runs the step.

The rules:
- waiting requests are served round-robin, one sentence each in turn, so a one-sentence request
  is not stuck behind a 64-sentence one;
- a sentence joins when its rows fit `max_rows` (each lane its own) and its cache reservation fits
  `max_cache_tokens` (both lanes); without an express lane, beams may fill only `wide_rows` while
  others run, so a greedy sentence can join at the next step even when the batch is full of beams;
- a sentence that does not fit is passed over, unless it has waited `starvation_s`: then
  nothing else is admitted before it, except greedy sentences in the rows beams may not fill;
- when sentences must be encoded for this step, up to `encode_ahead` of those likely to join
  next are encoded in the same run;
- a request whose deadline passed, or that was cancelled, leaves;
- with an express share set, the sentences of small greedy requests run in a batch of their own
  (`takes_express`: the plan's `lanes`), stepped between the main batch's steps for up to that
  share of the time while both have work (`next_lane`, from the lanes' load the batch measured,
  asked once the step's sentences have joined and left): a short request behind beams then waits
  for a few small steps instead of one main step per token. An express lane of more than
  `express_few` sentences (a flood of short requests, not a few behind a batch) takes one step
  for each main step instead: its rows then advance at the main rows' pace, not at their expense.

Admission reads the same rules (`backlog`, `expected_wait`): a request waits for its turns among
the waiting requests', in its lane, not for the whole queue.
"""

from __future__ import annotations

from bisect import bisect_left
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from itertools import accumulate
from typing import NamedTuple

from service.engine.decoding import Search
from service.engine.running import Encoded, Lane, LaneLoad
from service.scheduling.progress import NoSink, Sink


class CancelReason(StrEnum):
    """Why a request's sentences left before they finished (the metrics' `reason` label)."""

    DISCONNECT = "disconnect"  # its client left (the awaiting task was cancelled)
    DEADLINE = "deadline"
    SHUTDOWN = "shutdown"
    ERROR = "error"  # a step that held it failed


@dataclass(frozen=True)
class StepLimits:
    max_rows: int = 128  # rows (sentences x width) per decoder step: the latency/throughput knob
    max_cache_tokens: int = 65536  # admitted rows x (source + max new tokens), reserved at admission
    max_queue: int = 512  # sentences waiting or running before 429
    starvation_s: float = 0.5  # a passed-over sentence is admitted first after waiting this long
    admit_share: float = 0.3  # admit when the request's wait in its turns (`expected_wait`) fits in this
    # share of the time left (greedy sentences overtake beams in the rows kept for them, so a beam may
    # finish later than projected; with beam rows cheaper than greedy ones since IO contract 6, a
    # row-step is a looser unit: at 0.35 the overload check's slowest admitted request took 3.4-4.3 s
    # of its 5, at 0.3 3.0-3.7 s)
    keep_share: float = 0.6  # and when it keeps every waiting request's wait within this share of that
    # one's time left: later arrivals take turns from the requests before them; twice admit_share, so
    # the estimate may drift (the throughput measured anew) without refusing a short request's turn
    encode_ahead: int = 16  # waiting sentences encoded with those joining, held until their turn
    express_share: float = 0.0  # the time express steps may take while the main batch runs; 0: no express
    # lane (the service's default is SERVE_STEP_EXPRESS_SHARE's)
    express_work: int = 128  # the largest request (estimated row-steps, all its sentences) that takes it
    express_few: int = 8  # an express lane of more sentences steps once a main step, not by the share

    def __post_init__(self) -> None:
        if self.max_rows < 1 or self.max_cache_tokens < 1 or self.max_queue < 1 or not 0 < self.admit_share <= 1:
            raise ValueError(f"invalid step limits {self}")
        if not self.admit_share <= self.keep_share <= 1:
            raise ValueError(f"invalid step limits {self}")
        if not 0 <= self.express_share < 1 or self.express_work < 0 or self.express_few < 0:
            raise ValueError(f"invalid step limits {self}")

    @property
    def wide_rows(self) -> int:
        """Rows beam sentences may fill while others run: an eighth of the budget is kept for
        greedy sentences, so a short greedy request joins at the next step even while the
        batch is full of beams (a beam wider than this still runs, alone). With an express lane
        the short greedy requests take that lane, whose rows are a budget of their own, and beams
        may fill every main row: kept free, the eighth split 32 closed-loop beam-4 clients into
        28 running and 4 waiting for them."""
        return self.max_rows if self.express_share > 0 else self.max_rows - max(1, self.max_rows // 8)


@dataclass(eq=False)
class Job:
    """One request's sentences; its progress goes to `sink` (`service.scheduling.progress`)."""

    deadline: float
    enqueued: float
    sink: Sink = field(default_factory=NoSink)
    tokens: bool = False  # publish each token its greedy and sampled rows choose
    sentences: list[Sentence] = field(default_factory=list)
    remaining: int = 0
    admitted: int = 0  # sentences taken from the queue so far (in order)
    cancelled: CancelReason | None = None
    work: int = 0  # estimated row-steps of all its sentences
    tally: Tally | None = field(default=None, repr=False)  # what admission reads of it (`tally`), once


class Mark(NamedTuple):
    """When a sentence joined or left the running batch (a trace span reads it)."""

    at_ns: int  # time.time_ns()
    rows: int  # rows in the batch then
    step: int  # the scheduler's steps so far


@dataclass(eq=False)
class Sentence:
    job: Job
    index: int
    ids: Sequence[int]
    search: Search
    work: int  # estimated row-steps
    reserve: int  # cache tokens held while active
    encoded: Encoded | None = None  # encoded ahead of its admission, until it joins
    encoder: tuple[int, int] | None = None  # its encoder run's start and end (time.time_ns())
    joined: Mark | None = None
    left: Mark | None = None  # finished


@dataclass(frozen=True)
class Usage:
    """What the running batch holds now."""

    rows: int  # of the main lane (the only one without an express share)
    cache_tokens: int  # reserved by its sentences, in either lane
    express_rows: int = 0  # of the express lane: a budget of `max_rows` of its own


@dataclass(frozen=True)
class Plan:
    admit: list[Sentence]  # join the batch at this step, in this order
    encode: list[Sentence]  # one encoder run now: the admitted not encoded yet, and some likely next
    evict: list[Job]  # leave now: cancelled, or past their deadline (not cancelled yet)
    waiting: list[Job]  # the queue afterwards, in round-robin order
    admitted: dict[Job, int]  # the jobs whose cursor moved: sentences taken from the queue so far
    lanes: list[Lane] = field(default_factory=list)  # the lane each admitted sentence joins


def plan(waiting: Sequence[Job], jobs: Iterable[Job], running: Usage, limits: StepLimits, now: float) -> Plan:
    """This step's decision for the queue `waiting` (round-robin order) and every unanswered job."""
    evict = [j for j in jobs if j.cancelled is not None or j.deadline <= now]
    gone = set(evict)
    queue, cursor = deque(waiting), dict[Job, int]()
    admit = _select(queue, cursor, gone, running, limits, now)
    encode = [s for s in admit if s.encoded is None]
    if encode:
        encode += _ahead(queue, cursor, gone, limits.encode_ahead)
    lanes = [Lane.EXPRESS if takes_express(s, limits) else Lane.MAIN for s in admit]
    return Plan(admit, encode, evict, list(queue), cursor, lanes)


def _select(
    queue: deque[Job], cursor: dict[Job, int], gone: set[Job], running: Usage, limits: StepLimits, now: float
) -> list[Sentence]:
    """Waiting sentences to admit: round-robin over jobs within the budgets (turns `queue` and
    moves `cursor`)."""
    rows, reserved, chosen = [running.rows, running.express_rows], running.cache_tokens, []
    skipped = 0  # jobs in a row whose next sentence did not fit
    wide_held = False  # a starving beam sentence waits for rows: no other beam goes in first
    while queue and skipped < len(queue):
        job = queue[0]
        if job in gone:  # its owner answers it
            queue.popleft()
            continue
        i = cursor.get(job, job.admitted)
        s = job.sentences[i]
        if not s.search.done:  # a sentence with limit 0 was answered without a step
            width, lane = s.search.width, takes_express(s, limits)
            cap = limits.max_rows if width == 1 or not rows[lane] else limits.wide_rows
            fits = rows[lane] + width <= cap and reserved + s.reserve <= limits.max_cache_tokens
            if not fits or (width > 1 and wide_held):
                if now - job.enqueued >= limits.starvation_s:
                    if width == 1:
                        break  # nothing else goes in before it: the rows it needs will free up
                    wide_held = True  # greedy sentences still join, in the rows kept for them
                queue.rotate(-1)
                skipped += 1
                continue
            chosen.append(s)
            rows[lane] += width
            reserved += s.reserve
        cursor[job] = i + 1
        skipped = 0
        if i + 1 == len(job.sentences):
            queue.popleft()
        else:
            queue.rotate(-1)
    return chosen


def _ahead(queue: deque[Job], cursor: dict[Job, int], gone: set[Job], limit: int) -> list[Sentence]:
    """Waiting sentences likely to be admitted next (round-robin order) that are not encoded
    yet, while at most `limit` are encoded ahead. When the batch is full, a sentence or two joins
    at a step; encoding them one run each costs several times what one run for a dozen costs per
    sentence (the encoder starts from caches the decoder filled)."""
    out: list[Sentence] = []
    held, depth = 0, 0
    while held + len(out) < limit:
        more = False
        for job in queue:
            i = cursor.get(job, job.admitted) + depth
            if job in gone or i >= len(job.sentences):
                continue
            more = True
            s = job.sentences[i]
            if s.search.done:
                continue
            if s.encoded is None:
                out.append(s)
            else:
                held += 1
            if held + len(out) >= limit:
                break
        if not more:
            break
        depth += 1
    return out


def takes_express(s: Sentence, limits: StepLimits) -> bool:
    """Whether a sentence runs in the express batch: its request's (`express_request`)."""
    return express_request(s.job, limits)


def express_request(job: Job, limits: StepLimits) -> bool:
    """Whether a request's sentences run in the express batch: one-row sentences (greedy or a
    single sample; its answer waits for its slowest), small enough (`express_work`) to be someone
    waiting at a screen, not a batch job."""
    return (
        limits.express_share > 0 and job.work <= limits.express_work and all(x.search.width == 1 for x in job.sentences)
    )


class Tally(NamedTuple):
    """What admission reads of a request, counted once (its sentences do not change)."""

    width: int  # its widest sentence's rows
    live: list[int]  # from each sentence on, those with steps to run
    work: list[float]  # and their estimated row-steps

    def express(self, job: Job, limits: StepLimits) -> bool:
        """`express_request`, in one step."""
        return limits.express_share > 0 and job.work <= limits.express_work and self.width == 1


def tally(job: Job) -> Tally:
    """The request's `Tally`, kept on it."""
    if job.tally is None:
        live, work = [0], [0.0]
        for s in reversed(job.sentences):
            live.append(live[-1] + (not s.search.done))
            work.append(work[-1] + (0 if s.search.done else s.work))
        width = max((s.search.width for s in job.sentences), default=1)
        job.tally = Tally(width, live[::-1], work[::-1])
    return job.tally


class Wait(NamedTuple):
    """A request's wait for its answer under this policy, were it admitted now (`expected_wait`)."""

    seconds: float  # until its answer, in its turns
    crowds: bool  # its turns would push a waiting request's wait past `keep_share` of that one's time left


class _Lane:
    """One lane's unanswered requests: the work of its running sentences; how much of its waiting
    sentences' work runs within m round-robin turns (all of a request with fewer sentences, m of
    the others'); how much more each waiting request can wait within `keep_share` of its time left."""

    def __init__(self, running: float, waiting: list[tuple[int, float, float]], share: float) -> None:
        """`waiting`: each request's waiting sentences, their work, and the work that fits in
        `keep_share` of its time left at full speed; `share`: of the time, while the other lane has work."""
        waiting = sorted(waiting)
        self.running, self.share = running, share
        self.counts = [m for m, _, _ in waiting]
        self.whole = [0.0, *accumulate(w for _, w, _ in waiting)]  # the first i requests' work
        self.per_turn = [*accumulate((w / m for m, w, _ in reversed(waiting)), initial=0.0)][::-1]  # from i on
        # room: the work each waiting request's wait may still grow by (inf: past it already, held to
        # nothing); the least from i on, and the least per turn of those before i
        inf = float("inf")
        room = [fits * share - self.before(m) for m, _, fits in waiting]
        room = [r if r >= 0 else inf for r in room]
        self.room_from = [*accumulate(reversed(room), min, initial=inf)][::-1]
        self.room_per_turn = [*accumulate((r / m for r, m in zip(room, self.counts, strict=True)), min, initial=inf)]

    def before(self, m: int) -> float:
        """The work that runs in this lane until a request of it has taken m turns (its own included)."""
        i = bisect_left(self.counts, m)
        return self.running + self.whole[i] + m * self.per_turn[i]

    def crowded(self, m: int, each: float) -> bool:
        """Whether m turns of `each` row-steps would push a waiting request past its room."""
        i = bisect_left(self.counts, m)
        return self.room_from[i] < m * each or self.room_per_turn[i] < each


@dataclass(frozen=True)
class Backlog:
    """The unanswered requests as admission weighs a new one against them (`backlog`): built at
    most once a step or so, read by `expected_wait` in a few steps per request."""

    lanes: tuple[_Lane, _Lane]  # main, express
    rows: int  # the rows of every unanswered sentence
    rate: float  # row-steps a second, as measured when it was built
    at: float  # when it was built


def backlog(jobs: Iterable[Job], limits: StepLimits, rate: float, now: float) -> Backlog:
    """The unanswered `jobs` at `rate` row-steps a second: by lane, the work of their running
    sentences and their waiting ones (in turns), and each waiting request's room (`expected_wait`)."""
    running, rows, lane_rows = [0.0, 0.0], 0, [0, 0]
    waiting: tuple[list[tuple[int, float, float]], list[tuple[int, float, float]]] = ([], [])
    for k in jobs:
        if k.cancelled is not None or not k.remaining:
            continue
        t = tally(k)
        lane = t.express(k, limits)
        m = t.live[k.admitted]
        running[lane] += (k.remaining - m) * t.work[0] / max(1, t.live[0])
        rows += k.remaining * t.width
        lane_rows[lane] += k.remaining * t.width
        if m:
            waiting[lane].append((m, t.work[k.admitted], limits.keep_share * (k.deadline - now) * rate))
    main_busy, express_busy = bool(running[0] or waiting[0]), bool(running[1] or waiting[1])
    share = express_time(lane_rows[1], lane_rows[0], limits)
    main = _Lane(running[0], waiting[0], 1.0 - share if express_busy else 1.0)
    express = _Lane(running[1], waiting[1], share if main_busy else 1.0)
    return Backlog((main, express), rows, rate, now)


def expected_wait(queued: Backlog, job: Job, limits: StepLimits, since: Sequence[Job] = ()) -> Wait:
    """How long `job` would wait for its answer if it joined the `queued` requests (and those
    admitted `since` the backlog was built, counted whole in its turns) now, served as
    `plan` serves them at the backlog's throughput (the loaded batch's), and whether it would make
    a request waiting before it late. Waiting requests take turns, one sentence each, so within m
    turns a request of w waiting sentences runs min(m, w) of them. A request of m sentences waits
    for the larger of:
    - work: in its lane, the sentences running now, min(m, w) of each waiting request's and its
      own, at the share of the time its lane runs while the other has work (`express_share`, the
      rest for the main lane): under load the other lane is refilled as fast as it empties;
    - steps: its longest sentence's steps (one token each), each a step of the rows in flight (at
      most `max_rows`): what a short sentence waits for in a batch full of others' long ones.
    Later arrivals take their turns from the requests waiting before them in the same way (one
    may even pass a beam sentence the rows do not fit), so a request is also refused (`crowds`)
    when its turns would push a waiting request of its lane past `keep_share` of that one's time
    left: the queue cannot grow until the requests admitted first time out. One already past it
    (admitted on an idle queue, or the throughput measured anew) is not held to it: refusing a
    short turn would not save it."""
    t = tally(job)
    express = t.express(job, limits)
    lane, n, rows = queued.lanes[express], t.live[0], queued.rows + t.width
    each = job.work / max(1, n)
    later, turns, per_turn = 0.0, n, each  # the turns of those admitted since, which crowd the backlog too
    for k in since:
        tk = tally(k)
        rows += k.remaining * tk.width
        if tk.express(k, limits) == express:
            later += min(n, tk.live[0]) * tk.work[0] / max(1, tk.live[0])
            turns, per_turn = max(turns, tk.live[0]), per_turn + tk.work[0] / max(1, tk.live[0])
    steps = max((s.work // s.search.width for s in job.sentences if not s.search.done), default=0)
    seconds = max(
        (lane.before(n) + later + job.work) / (queued.rate * lane.share),
        steps * min(rows, limits.max_rows) / queued.rate,
    )
    return Wait(seconds, lane.crowded(turns, per_turn))


def express_turn(express_s: float, main_s: float, share: float) -> bool:
    """Whether the express batch steps next while the main batch also has work: its steps since the
    main batch's last step (`express_s` seconds) stay within `share` of the time, the main step
    (`main_s`, its last duration) taking the rest. The main batch keeps at least 1 - share of the
    time however many short requests arrive; a short request waits for at most one main step."""
    return express_s < share / (1.0 - share) * main_s


def express_time(express_rows: int, main_rows: int, limits: StepLimits) -> float:
    """The share of the time the express lane takes while both lanes have work, as `next_lane`
    steps them: the express share while the lane holds a few sentences; beyond `express_few`, one
    step each in turn, which takes about the lanes' rows' share (a step's time grows with its rows;
    the main batch steps at most `max_rows`)."""
    if express_rows <= limits.express_few:
        return limits.express_share
    express, main = min(express_rows, limits.max_rows), min(max(1, main_rows), limits.max_rows)
    return express / (express + main)  # a main lane of none: as of one row, the newcomer's own


def next_lane(load: LaneLoad, limits: StepLimits) -> Lane:
    """The lane that steps next: the express lane while it has work and the main lane has none,
    or while its steps since the main lane's last one stay within the express share
    (`express_turn`); an express lane of more than `express_few` sentences, once after each main
    step. Else the main lane."""
    if not load.express:
        return Lane.MAIN
    if not load.main:
        return Lane.EXPRESS
    if load.express > limits.express_few:
        return Lane.EXPRESS if load.express_s == 0.0 and load.main_s > 0.0 else Lane.MAIN
    return Lane.EXPRESS if express_turn(load.express_s, load.main_s, limits.express_share) else Lane.MAIN
