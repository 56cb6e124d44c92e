"""The step scheduler's policy: which waiting sentences join the running batch at this step,
which requests leave it. Pure: `plan(waiting, jobs, running, limits, now)` reads the queue and
returns a `Plan`, changing nothing, so every rule is unit-tested without threads or a model
(vLLM's scheduler separates deciding from executing the same way). `stepper.StepScheduler`
applies the plan and runs the step.

The rules:
- waiting requests are served round-robin, one sentence each in turn, so a one-sentence request
  is not stuck behind a 64-sentence one;
- a sentence joins when its rows fit `max_rows` and its cache reservation fits
  `max_cache_tokens`; beams may fill only `wide_rows` while others run, so a greedy sentence
  can join at the next step even when the batch is full of beams;
- a sentence that does not fit is passed over, unless it has waited `starvation_s`: then
  nothing else is admitted before it, except greedy sentences in the rows beams may not fill;
- when sentences must be encoded for this step, up to `encode_ahead` of those likely to join
  next are encoded in the same run;
- a request whose deadline passed, or that was cancelled, leaves;
- with an express share set, the sentences of small greedy requests run in a batch of their own
  (`takes_express`: the plan's `lanes`), stepped between the main batch's steps for up to that
  share of the time while both have work (`next_lane`, from the lanes' load the batch measured,
  asked once the step's sentences have joined and left): a short request behind beams then waits
  for a few small steps instead of one main step per token.
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
    admit_share: float = 0.3  # admit when the request's wait in its turn (`expected_wait`) fits in this
    # share of the time left (greedy sentences overtake beams in the rows kept for them, so a beam may
    # finish later than projected; with beam rows cheaper than greedy ones since IO contract 6, a
    # row-step is a looser unit: at 0.35 the overload check's slowest admitted request took 3.4-4.3 s
    # of its 5, at 0.3 3.0-3.7 s)
    keep_share: float = 0.6  # and when no waiting request's wait, with the turns the new one takes
    # before its last sentence, would pass this share of its own time left: later arrivals take turns
    # from the requests admitted before them, so each admission must leave room for those
    encode_ahead: int = 16  # waiting sentences encoded with those joining, held until their turn
    express_share: float = 0.0  # the time express steps may take while the main batch runs; 0: no express
    # lane (the service's default is SERVE_STEP_EXPRESS_SHARE's)
    express_work: int = 128  # the largest request (estimated row-steps, all its sentences) that takes it

    def __post_init__(self) -> None:
        if self.max_rows < 1 or self.max_cache_tokens < 1 or self.max_queue < 1 or not 0 < self.admit_share <= 1:
            raise ValueError(f"invalid step limits {self}")
        if not self.admit_share <= self.keep_share <= 1:
            raise ValueError(f"invalid step limits {self}")
        if not 0 <= self.express_share < 1 or self.express_work < 0:
            raise ValueError(f"invalid step limits {self}")

    @property
    def wide_rows(self) -> int:
        """Rows beam sentences may fill while others run: an eighth of the budget is kept for
        greedy sentences, so a short greedy request joins at the next step even while the
        batch is full of beams (a beam wider than this still runs, alone)."""
        return self.max_rows - max(1, self.max_rows // 8)


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

    rows: int
    cache_tokens: int  # reserved by its sentences


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
    rows, reserved, chosen = running.rows, running.cache_tokens, []
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
            width = s.search.width
            cap = limits.max_rows if width == 1 or not rows else limits.wide_rows
            fits = rows + width <= cap and reserved + s.reserve <= limits.max_cache_tokens
            if not fits or (width > 1 and wide_held):
                if now - job.enqueued >= limits.starvation_s:
                    if width == 1:
                        break  # nothing else goes in before it: the rows it needs will free up
                    wide_held = True  # greedy sentences still join, in the rows kept for them
                queue.rotate(-1)
                skipped += 1
                continue
            chosen.append(s)
            rows += width
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


class Wait(NamedTuple):
    """A request's wait for its answer under this policy, were it admitted now (`expected_wait`)."""

    seconds: float  # until its answer, in its turns
    crowds: bool  # it would push a waiting request's wait past `keep_share` of that one's time left


def expected_wait(jobs: Iterable[Job], job: Job, limits: StepLimits, rate: float, now: float) -> Wait:
    """How long `job` would wait for its answer if it joined the unanswered `jobs` now, served as
    `plan` serves them at `rate` row-steps a second (the loaded batch's); and whether it would make
    a request already waiting late. Waiting requests take turns, one sentence each, so within m
    turns a request of w waiting sentences runs min(m, w) of them. A request of m sentences waits
    for the larger of:
    - work: the sentences running now, min(m, w) of each waiting request's, and its own; in the
      main lane the express lane's requests count too (their steps take the main lane's time), the
      express lane counts its own and runs at its share of the time while the main lane has work;
    - steps: its longest sentence's steps (one token each), each a step of the rows in flight (at
      most `max_rows`): what a short sentence waits for in a batch full of others' long ones.
    Every request admitted later takes its turns in the same way from those waiting before it, so
    this one is refused (`crowds`) if its turns would push a waiting request's work, counted alike,
    past `keep_share` of that request's time left, when it was within it before: a heavy request
    is then refused while lighter ones queue, instead of timing out behind later arrivals."""
    mine = express_request(job, limits)
    running, rows = [0.0, 0.0], 0  # work of the sentences in the batch, by lane (main, express)
    counts: list[list[tuple[int, float]]] = [[], []]  # each waiting request's sentences and their work, by lane
    waiting: list[tuple[Job, bool, int, float]] = []  # the same, with the request and its lane
    for k in jobs:
        if k is job or k.cancelled is not None or not k.remaining:
            continue
        lane = express_request(k, limits)
        left = [s for s in k.sentences[k.admitted :] if not s.search.done]
        each = k.work / max(1, sum(not s.search.done for s in k.sentences))
        running[lane] += (k.remaining - len(left)) * each
        rows += k.remaining * max(s.search.width for s in k.sentences)
        if left:
            work = float(sum(s.work for s in left))
            counts[lane].append((len(left), work))
            waiting.append((k, lane, len(left), work))
    turns = [_Turns(counts[0]), _Turns(counts[1])]
    main_busy = bool(running[0] or counts[0]) or not mine

    def before(lane: bool, m: int) -> tuple[float, float]:
        """Work that runs before a waiting request of `lane` takes its m turns (its own included),
        and the share of the time its lane runs."""
        if lane:
            return running[1] + turns[1].within(m), limits.express_share if main_busy else 1.0
        return sum(running) + turns[0].within(m) + turns[1].within(m), 1.0

    n = sum(not s.search.done for s in job.sentences)
    ahead, share = before(mine, n)
    steps = max((s.work // s.search.width for s in job.sentences if not s.search.done), default=0)
    widest = max((s.search.width for s in job.sentences), default=1)
    seconds = max((ahead + job.work) / (rate * share), steps * min(rows + widest, limits.max_rows) / rate)
    each = job.work / max(1, n)
    for k, lane, m, _ in waiting:
        if lane and not mine:
            continue  # the main lane's turns do not delay the express lane's
        work, share = before(lane, m)
        limit = limits.keep_share * (k.deadline - now) * rate * share
        if work <= limit < work + min(m, n) * each:
            return Wait(seconds, True)
    return Wait(seconds, False)


class _Turns:
    """A lane's waiting requests, as their counts of sentences and their work: how much of it
    runs within m round-robin turns (all of a request with fewer sentences, m of the rest's)."""

    def __init__(self, queued: list[tuple[int, float]]) -> None:
        queued = sorted(queued)
        self.counts = [m for m, _ in queued]
        self.whole = [0.0, *accumulate(w for _, w in queued)]  # the first i requests' work
        self.per_turn = [*accumulate((w / m for m, w in reversed(queued)), initial=0.0)][::-1]  # from i on

    def within(self, m: int) -> float:
        i = bisect_left(self.counts, m)
        return self.whole[i] + m * self.per_turn[i]


def express_turn(express_s: float, main_s: float, share: float) -> bool:
    """Whether the express batch steps next while the main batch also has work: its steps since the
    main batch's last step (`express_s` seconds) stay within `share` of the time, the main step
    (`main_s`, its last duration) taking the rest. The main batch keeps at least 1 - share of the
    time however many short requests arrive; a short request waits for at most one main step."""
    return express_s < share / (1.0 - share) * main_s


def next_lane(load: LaneLoad, limits: StepLimits) -> Lane:
    """The lane that steps next: the express lane while it has work and the main lane has none,
    or while its steps since the main lane's last one stay within the express share
    (`express_turn`); else the main lane."""
    if load.express and (not load.main or express_turn(load.express_s, load.main_s, limits.express_share)):
        return Lane.EXPRESS
    return Lane.MAIN
