"""Step-level (continuous) batching for a translator: sentences join and leave the running batch
at every decoder step. Knows nothing about HTTP.

One thread per translator loops: drop what was cancelled or expired, admit waiting sentences
within the row and cache budgets (one encoder run for all newly admitted, which also encodes up
to `encode_ahead` of the sentences still waiting, so that under load a sentence or two joining
at a step rarely needs a run of its own), run one decoder step for every active row, deliver the
sentences that finished. Greedy, beam and sampled sentences
with any parameters share the same steps; each sentence's `Search` keeps it independent of
its neighbours.

Admission is fair and cost-aware:
- waiting requests are served round-robin, one sentence each in turn, so a one-sentence request
  is not stuck behind a 64-sentence one; a sentence too wide for the free rows is passed over,
  unless it has waited `starvation_s`, then nothing else is admitted before it, except greedy
  sentences in the eighth of the rows beams may not fill (`StepLimits.wide_rows`);
- a request is refused at once (`QueueFull`, 429) when the queued work would overflow
  `max_queue` sentences or could not finish before the request's deadline at the throughput
  measured on full steps; work is estimated in row-steps (rows x expected tokens);
- a request whose client left (its awaiting task is cancelled), whose deadline passed, or that
  is still running at shutdown leaves the batch at the next step.
"""

from __future__ import annotations

import asyncio
import logging
import math
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from service.engine.decoding import Hypothesis, Search
from service.engine.running import Encoded, RunningBatch, ShardedBatch, StepError
from service.errors import DeadlineExceeded, InputTooLong, InvalidInput, NotReady, QueueFull, ShuttingDown
from service.priority import lower_priority

log = logging.getLogger(__name__)


class StepObserver(Protocol):
    """Hooks for metrics, called from the scheduler thread (and `queue_depth` from submitters)."""

    def queue_depth(self, depth: int) -> None: ...

    def batch_started(self, size: int, queue_waits: Sequence[float]) -> None: ...

    def generated(self, tokens: int) -> None: ...

    def active(self, sentences: int, rows: int) -> None: ...

    def cancelled(self, reason: str, sentences: int) -> None: ...


@dataclass(frozen=True)
class StepLimits:
    max_rows: int = 64  # rows (sentences x width) per decoder step: the latency/throughput knob
    max_cache_tokens: int = 65536  # admitted rows x (source + max new tokens), reserved at admission
    max_queue: int = 512  # sentences waiting or running before 429
    starvation_s: float = 0.5  # a passed-over sentence is admitted first after waiting this long
    admit_share: float = 0.35  # admit when the queued work fits in this share of the time left (greedy
    # sentences overtake beams in the rows kept for them, so a beam may finish later than projected)
    encode_ahead: int = 16  # waiting sentences encoded with those joining, held until their turn

    def __post_init__(self) -> None:
        if self.max_rows < 1 or self.max_cache_tokens < 1 or self.max_queue < 1 or not 0 < self.admit_share <= 1:
            raise ValueError(f"invalid step limits {self}")

    @property
    def wide_rows(self) -> int:
        """Rows beam sentences may fill while others run: an eighth of the budget is kept for
        greedy sentences, so a short greedy request joins at the next step even while the
        batch is full of beams (a beam wider than this still runs, alone)."""
        return self.max_rows - max(1, self.max_rows // 8)


@dataclass(eq=False)
class Job:
    """One request's sentences, answered together."""

    deadline: float
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future[list[list[Hypothesis]]]
    sentences: list[Sentence] = field(default_factory=list)
    results: list[list[Hypothesis]] = field(default_factory=list)
    remaining: int = 0
    admitted: int = 0  # sentences taken into the batch so far (in order)
    cancelled: str | None = None  # "disconnect", "deadline" or "shutdown"
    enqueued: float = 0.0


@dataclass(eq=False)
class Sentence:
    job: Job
    index: int
    ids: Sequence[int]
    search: Search
    work: int  # estimated row-steps
    reserve: int  # cache tokens held while active
    encoded: Encoded | None = None  # encoded ahead of its admission, until it joins


def estimate_work(source_tokens: int, width: int, limit: int) -> int:
    """Row-steps a sentence is expected to cost: its rows times a target length guess (about
    twice the source, never above its limit)."""
    return width * min(limit, 2 * source_tokens + 8)


class StepScheduler:
    def __init__(
        self,
        name: str,
        make_batch: Callable[[], RunningBatch[Sentence] | ShardedBatch[Sentence]],
        limits: StepLimits,
        observer: StepObserver,
    ) -> None:
        self.name, self.limits, self.observer = name, limits, observer
        self._make_batch = make_batch
        self._cv = threading.Condition()
        self._waiting: deque[Job] = deque()  # jobs with sentences not yet admitted, round-robin order
        self._jobs: set[Job] = set()  # every unanswered job
        self._sentences = 0  # waiting or active sentences
        self._work = 0  # their estimated row-steps
        self._closing = False
        self._stop = False
        self._thread: threading.Thread | None = None
        self._rate: float | None = None  # row-steps per second measured on full steps
        self.steps = 0  # decoder steps run (for tests and logs)

    # -- event-loop side ---------------------------------------------------------------------

    @property
    def in_flight(self) -> int:
        with self._cv:
            return self._sentences

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name=f"stepper-{self.name}", daemon=True)
            self._thread.start()

    async def submit(self, items: Sequence[tuple[Sequence[int], Search]], deadline: float) -> list[list[Hypothesis]]:
        """Hypotheses per item (source ids with EOS, its search) once every item is done."""
        if self._thread is None:
            raise NotReady(f"model {self.name} is not started")
        loop = asyncio.get_running_loop()
        now = time.monotonic()
        if deadline <= now:
            raise DeadlineExceeded("the request deadline passed before it was queued")
        job = Job(deadline, loop, loop.create_future(), enqueued=now)
        for i, (ids, search) in enumerate(items):
            work = estimate_work(len(ids), search.width, search.limit)
            reserve = search.width * (len(ids) + search.limit)
            job.sentences.append(Sentence(job, i, ids, search, work, reserve))
        job.results = [s.search.hypotheses() if s.search.done else [] for s in job.sentences]
        job.remaining = sum(not s.search.done for s in job.sentences)
        if not job.remaining:
            return job.results
        with self._cv:
            self._admit_job(job, now)
            self._jobs.add(job)
            self._waiting.append(job)
            self._cv.notify()
            depth = self._depth()
        self.observer.queue_depth(depth)
        try:
            # The deadline holds here too, even while the scheduler thread is inside a long step.
            return await asyncio.wait_for(asyncio.shield(job.future), job.deadline - time.monotonic())
        except TimeoutError:
            self._cancel(job, "deadline")
            where = "while queued" if job.admitted == 0 else "while running"
            raise DeadlineExceeded(f"the request deadline passed {where}") from None
        except asyncio.CancelledError:
            self._cancel(job, "disconnect")
            raise

    def _cancel(self, job: Job, reason: str) -> None:
        """Marks a job that nobody waits for any more; its sentences leave at the next step."""
        job.future.add_done_callback(lambda f: f.cancelled() or f.exception())  # nobody will read it
        with self._cv:
            if job.cancelled is None:
                job.cancelled = reason
                self._cv.notify()

    def refuse_if_busy(self, deadline: float) -> None:
        """Raises the QueueFull any request would get now: the queued work alone would not finish
        in the deadline's share. Checked before a request's texts are split and tokenized, so an
        overloaded server refuses at the cost of reading the JSON, not of preparing the texts."""
        with self._cv:
            self._check_time(0, deadline - time.monotonic())

    def _check_time(self, work: int, time_left: float) -> None:
        """QueueFull when the queued work plus `work` would not finish within `admit_share` of
        `time_left` at the measured throughput (under the lock)."""
        if not (self._rate and self._work):
            return
        projected = (self._work + work) / self._rate
        if projected > self.limits.admit_share * time_left:
            error = QueueFull(
                f"model {self.name} is busy: about {projected:.1f} s of queued work, more than this request's "
                "deadline allows; retry later"
            )
            error.retry_after = max(1, math.ceil(self._work / self._rate))
            raise error

    def _admit_job(self, job: Job, now: float) -> None:
        """Refuses a job the queue cannot hold or could not finish in time (under the lock)."""
        n = job.remaining
        if self._closing:
            raise ShuttingDown(f"model {self.name} is shutting down")
        if self._sentences + n > self.limits.max_queue:
            raise QueueFull(
                f"model {self.name} has {self._sentences} of {self.limits.max_queue} sentences queued; retry later"
            )
        widest = max(s.search.width for s in job.sentences if not s.search.done)
        if widest > self.limits.max_rows:
            raise InvalidInput(f"beam width {widest} exceeds this model's {self.limits.max_rows} rows per step")
        largest = max(s.reserve for s in job.sentences)
        if largest > self.limits.max_cache_tokens:
            raise InputTooLong(
                f"a sentence needs {largest} cache tokens (rows x (source + max_new_tokens)); this server holds "
                f"{self.limits.max_cache_tokens}: lower max_new_tokens or the beam size"
            )
        work = sum(s.work for s in job.sentences if not s.search.done)
        self._check_time(work, job.deadline - now)
        self._sentences += n
        self._work += work

    async def close(self, timeout: float) -> None:
        """Stops admitting; admitted work runs for up to `timeout` s; the rest fails with ShuttingDown."""
        with self._cv:
            self._closing = True
            self._cv.notify()
        end = time.monotonic() + timeout
        while self.in_flight and time.monotonic() < end:
            await asyncio.sleep(0.01)
        with self._cv:
            left = self._sentences
            for job in list(self._jobs):
                if job.cancelled is None:
                    job.cancelled = "shutdown"
            self._stop = True
            self._cv.notify()
        if left:
            log.warning("stepper %s: %d sentences unfinished after %.1f s", self.name, left, timeout)
        if self._thread is not None:
            await asyncio.get_running_loop().run_in_executor(None, self._thread.join, 5.0)

    # -- the scheduler thread ----------------------------------------------------------------

    def _run(self) -> None:
        lower_priority()
        batch = self._make_batch()
        reserved = 0  # cache tokens held by admitted sentences
        while True:
            with self._cv:
                while not self._stop and not batch.blocks and not self._waiting:
                    self._cv.wait()
                if self._stop and not batch.blocks and not self._waiting:
                    if isinstance(batch, ShardedBatch):
                        batch.close()
                    return
                now = time.monotonic()
                self._expire(now)
                admitted = self._select(batch.rows, reserved, now)
                fresh = [s for s in admitted if s.encoded is None]
                ahead = self._next_waiting(self.limits.encode_ahead) if fresh else []
            gone = batch.drop(lambda s: s.job.cancelled is None)
            reserved -= sum(s.reserve for s in gone)
            self._forget(gone)
            reserved += sum(s.reserve for s in admitted)
            try:
                if admitted:
                    self.observer.batch_started(len(admitted), [now - s.job.enqueued for s in admitted])
                    if fresh:
                        encode = fresh + ahead
                        for s, enc in zip(encode, batch.encode([s.ids for s in encode]), strict=True):
                            s.encoded = enc
                    encoded = []
                    for s in admitted:
                        assert s.encoded is not None
                        encoded.append(s.encoded)
                        s.encoded = None  # the batch holds its copy now
                    batch.join_encoded(encoded, [s.search for s in admitted], admitted)
                rows, t0 = batch.rows, time.perf_counter()
                finished = batch.step()
            except Exception as exc:  # a failing step fails the sentences it held, nothing else
                log.exception("stepper %s: decoder step failed", self.name)
                answered = set()
                others: list[tuple[Sentence, list[Hypothesis]]] = exc.finished if isinstance(exc, StepError) else []
                for sent, hyps in others:  # what another shard finished in the failing step
                    answered.add(id(sent))
                    reserved -= sent.reserve
                    self._finish(sent, hyps)
                held = {id(s): s for s in [*batch.drop(lambda s: False), *admitted] if id(s) not in answered}
                failed = list(held.values())
                reserved -= sum(s.reserve for s in failed)
                self._fail_jobs({s.job for s in failed}, exc)
                self._forget(failed)
                continue
            if rows:
                self._measure(rows, time.perf_counter() - t0)
                self.steps += 1
            for s, hyps in finished:
                reserved -= s.reserve
                self._finish(s, hyps)
            self.observer.active(len(batch.blocks), batch.rows)

    def _select(self, rows: int, reserved: int, now: float) -> list[Sentence]:
        """Waiting sentences to admit now: round-robin over jobs within the budgets (under the lock)."""
        limits, chosen = self.limits, []
        skipped = 0  # jobs in a row whose next sentence did not fit
        wide_held = False  # a starving beam sentence waits for rows: no other beam goes in first
        while self._waiting and skipped < len(self._waiting):
            job = self._waiting[0]
            if job.cancelled is not None:  # `_forget` answers it
                self._waiting.popleft()
                continue
            s = job.sentences[job.admitted]
            if not s.search.done:  # a sentence with limit 0 was answered without a step
                width = s.search.width
                cap = limits.max_rows if width == 1 or not rows else limits.wide_rows
                fits = rows + width <= cap and reserved + s.reserve <= limits.max_cache_tokens
                if not fits or (width > 1 and wide_held):
                    if now - job.enqueued >= limits.starvation_s:
                        if width == 1:
                            break  # nothing else goes in before it: the rows it needs will free up
                        wide_held = True  # greedy sentences still join, in the rows kept for them
                    self._waiting.rotate(-1)
                    skipped += 1
                    continue
                chosen.append(s)
                rows += s.search.width
                reserved += s.reserve
            job.admitted += 1
            skipped = 0
            if job.admitted == len(job.sentences):
                self._waiting.popleft()
            else:
                self._waiting.rotate(-1)
        return chosen

    def _next_waiting(self, limit: int) -> list[Sentence]:
        """Waiting sentences likely to be admitted next (round-robin order) that are not encoded
        yet, while at most `limit` are encoded ahead (under the lock). When the batch is full, a
        sentence or two joins at a step; encoding them one run each costs several times what one
        run for a dozen costs per sentence (the encoder starts from caches the decoder filled)."""
        out: list[Sentence] = []
        held, depth = 0, 0
        while held + len(out) < limit:
            more = False
            for job in self._waiting:
                i = job.admitted + depth
                if job.cancelled is not None or i >= len(job.sentences):
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

    def _expire(self, now: float) -> None:
        """Marks jobs whose deadline passed (under the lock); the batch drops their sentences."""
        for job in self._jobs:
            if job.cancelled is None and job.deadline <= now:
                job.cancelled = "deadline"

    def _forget(self, gone: Sequence[Sentence]) -> None:
        """Accounts for sentences that left without finishing, and answers their jobs."""
        with self._cv:
            jobs = {s.job for s in gone}
            for job in list(self._jobs):  # waiting sentences of cancelled jobs leave too
                if job.cancelled is not None:
                    jobs.add(job)
            by_reason: dict[str, int] = {}
            for job in jobs:
                if job not in self._jobs:
                    continue
                left = job.remaining
                self._jobs.discard(job)
                if job in self._waiting:
                    self._waiting.remove(job)
                self._sentences -= left
                self._work -= sum(s.work for s in job.sentences if not s.search.done)
                job.remaining = 0
                reason = job.cancelled or "error"
                by_reason[reason] = by_reason.get(reason, 0) + left
                if job.cancelled == "deadline":
                    self._answer(job, DeadlineExceeded("the request deadline passed before its translation finished"))
                elif job.cancelled == "shutdown":
                    self._answer(job, ShuttingDown(f"model {self.name} shut down before this request finished"))
            depth = self._depth()
        for reason, n in by_reason.items():
            self.observer.cancelled(reason, n)
        self.observer.queue_depth(depth)

    def _finish(self, s: Sentence, hyps: list[Hypothesis]) -> None:
        job = s.job
        self.observer.generated(len(hyps[0].tokens) + int(hyps[0].finished) if hyps else 0)
        with self._cv:
            if job not in self._jobs:
                return
            job.results[s.index] = hyps
            job.remaining -= 1
            self._sentences -= 1
            self._work -= s.work
            if job.remaining == 0:
                self._jobs.discard(job)
                self._answer(job, job.results)

    def _fail_jobs(self, jobs: set[Job], exc: Exception) -> None:
        with self._cv:
            for job in jobs:
                if job.cancelled is None:
                    job.cancelled = "error"
                self._answer(job, exc)

    def _answer(self, job: Job, outcome: list[list[Hypothesis]] | BaseException) -> None:
        def settle() -> None:
            if job.future.done():
                return
            if isinstance(outcome, BaseException):
                job.future.set_exception(outcome)
            else:
                job.future.set_result(outcome)

        job.loop.call_soon_threadsafe(settle)

    def _measure(self, rows: int, seconds: float) -> None:
        """Throughput in row-steps per second, from steps at least half full (the admission estimate)."""
        if seconds > 0 and rows * 2 >= self.limits.max_rows:
            rate = rows / seconds
            self._rate = rate if self._rate is None else 0.8 * self._rate + 0.2 * rate

    def _depth(self) -> int:
        """Sentences waiting to be admitted (under the lock)."""
        return sum(len(j.sentences) - j.admitted for j in self._waiting)
