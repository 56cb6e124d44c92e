"""Step-level (continuous) batching for a translator: sentences join and leave the running batch
at every decoder step. Knows nothing about HTTP.

One thread per translator loops: ask the policy (`policy.plan`) which waiting sentences join and
which requests leave, drop what was cancelled or expired, encode the sentences that join (one
encoder run, which also encodes some of those likely to join next), run one decoder step for
every active row, deliver the sentences that finished. Greedy, beam and sampled sentences with
any parameters share the same steps; each sentence's `Search` keeps it independent of its
neighbours. The batch may be any `DecoderBatch` (one running batch, or shards on threads).

Admission (`Admission`, as the classifier's batcher) refuses a request at once (`QueueFull`,
429) when the queued work would overflow `max_queue` sentences or could not finish before the
request's deadline at the throughput measured while the batch is at least half full (rows over
the time of every step and encoder run, the express lane's included); work is estimated in
row-steps (rows x expected tokens). A request whose client left (its awaiting task is
cancelled), whose deadline passed, or that is still running at shutdown leaves the batch at the
next step.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Protocol

from service.engine.decoding import Hypothesis, Search
from service.engine.running import DecoderBatch, StepError
from service.errors import DeadlineExceeded, InputTooLong, InvalidInput, NotReady, ShuttingDown
from service.priority import lower_priority
from service.scheduling import policy
from service.scheduling.admission import Admission, LoadedSpan, estimate_work
from service.scheduling.policy import CancelReason, Job, Mark, Outcome, Sentence, StepLimits, Usage

__all__ = ["CancelReason", "Job", "Sentence", "StepLimits", "StepObserver", "StepScheduler"]

log = logging.getLogger(__name__)


class StepObserver(Protocol):
    """Hooks for metrics, called from the scheduler thread (and `queue_depth` from submitters)."""

    def queue_depth(self, depth: int) -> None: ...

    def batch_started(self, size: int, queue_waits: Sequence[float]) -> None: ...

    def generated(self, tokens: int) -> None: ...

    def active(self, sentences: int, rows: int) -> None: ...

    def cancelled(self, reason: str, sentences: int) -> None: ...


class StepScheduler:
    def __init__(
        self,
        name: str,
        make_batch: Callable[[], DecoderBatch[Sentence]],
        limits: StepLimits,
        observer: StepObserver,
    ) -> None:
        self.name, self.limits, self.observer = name, limits, observer
        self.admission = Admission(name, limits.max_queue, limits.admit_share, "sentences")  # rate: row-steps/s
        self._make_batch = make_batch
        self._cv = threading.Condition()
        self._waiting: deque[Job] = deque()  # jobs with sentences not yet admitted, round-robin order
        self._jobs: set[Job] = set()  # every unanswered job
        self._sentences = 0  # waiting or active sentences
        self._work = 0  # their estimated row-steps
        self._closing = False
        self._stop = False
        self._thread: threading.Thread | None = None
        self.steps = 0  # decoder steps run (for tests and logs)
        self._span = LoadedSpan(limits.max_rows)

    # -- event-loop side ---------------------------------------------------------------------

    @property
    def in_flight(self) -> int:
        with self._cv:
            return self._sentences

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name=f"stepper-{self.name}", daemon=True)
            self._thread.start()

    async def submit(
        self, items: Sequence[tuple[Sequence[int], Search]], deadline: float, seen: list[Job] | None = None
    ) -> list[list[Hypothesis]]:
        """Hypotheses per item (source ids with EOS, its search) once every item is done; the job
        is added to `seen`, if given (a trace reads its sentences' marks)."""
        if self._thread is None:
            raise NotReady(f"model {self.name} is not started")
        loop = asyncio.get_running_loop()
        now = time.monotonic()
        if deadline <= now:
            raise DeadlineExceeded("the request deadline passed before it was queued")
        future: asyncio.Future[list[list[Hypothesis]]] = loop.create_future()
        job = Job(deadline, now, _replier(loop, future))
        for i, (ids, search) in enumerate(items):
            work = estimate_work(len(ids), search.width, search.limit)
            reserve = search.width * (len(ids) + search.limit)
            job.sentences.append(Sentence(job, i, ids, search, work, reserve))
        job.results = [s.search.hypotheses() if s.search.done else [] for s in job.sentences]
        if seen is not None:
            seen.append(job)
        job.remaining = sum(not s.search.done for s in job.sentences)
        job.work = sum(s.work for s in job.sentences if not s.search.done)
        if not job.remaining:
            return job.results
        with self._cv:
            self._admit_job(job, now)
            self._jobs.add(job)
            self._waiting.append(job)
            self._cv.notify()
            depth = self._depth()
        self.observer.queue_depth(depth)
        # The deadline holds here too, even while the scheduler thread is inside a long step: it
        # fails the future itself (no wait_for and shield: two futures and a callback less per
        # request). The answer settles only a future not yet done.
        timer = loop.call_later(job.deadline - time.monotonic(), _expire, future)
        try:
            return await future
        except _Expired:
            self._cancel(job, CancelReason.DEADLINE)
            where = "while queued" if job.admitted == 0 else "while running"
            raise DeadlineExceeded(f"the request deadline passed {where}") from None
        except asyncio.CancelledError:
            if future.done() and not future.cancelled():
                future.exception()  # answered as the client left: read, no "never retrieved" noise
            self._cancel(job, CancelReason.DISCONNECT)
            raise
        finally:
            timer.cancel()

    def _cancel(self, job: Job, reason: CancelReason) -> None:
        """Marks a job that nobody waits for any more; its sentences leave at the next step."""
        with self._cv:
            if job.cancelled is None:
                job.cancelled = reason
                self._cv.notify()

    def refuse_if_busy(self, deadline: float) -> None:
        """Raises the QueueFull any request would get now: the queued work alone would not finish
        in the deadline's share. Checked before a request's texts are split and tokenized, so an
        overloaded server refuses at the cost of reading the JSON, not of preparing the texts."""
        with self._cv:
            self.admission.check_time(self._work, 0, deadline - time.monotonic())

    def _admit_job(self, job: Job, now: float) -> None:
        """Refuses a job the queue cannot hold or could not finish in time (under the lock)."""
        if self._closing:
            raise ShuttingDown(f"model {self.name} is shutting down")
        self.admission.check_room(self._sentences, job.remaining)
        widest = max(s.search.width for s in job.sentences if not s.search.done)
        if widest > self.limits.max_rows:
            raise InvalidInput(f"beam width {widest} exceeds this model's {self.limits.max_rows} rows per step")
        largest = max(s.reserve for s in job.sentences)
        if largest > self.limits.max_cache_tokens:
            raise InputTooLong(
                f"a sentence needs {largest} cache tokens (rows x (source + max_new_tokens)); this server holds "
                f"{self.limits.max_cache_tokens}: lower max_new_tokens or the beam size"
            )
        self.admission.check_time(self._work, job.work, job.deadline - now)
        self._sentences += job.remaining
        self._work += job.work

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
                    job.cancelled = CancelReason.SHUTDOWN
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
        try:
            while self._next_step(batch):
                pass
        finally:
            batch.close()

    def _next_step(self, batch: DecoderBatch[Sentence]) -> bool:
        """Plans and runs one step; False once stopped with nothing left."""
        with self._cv:
            while not self._stop and not batch.blocks and not self._waiting:
                self._cv.wait()
            if self._stop and not batch.blocks and not self._waiting:
                return False
            now = time.monotonic()
            running = Usage(batch.rows, sum(b.tag.reserve for b in batch.blocks))
            plan = policy.plan(self._waiting, self._jobs, running, self.limits, now)
            self._apply(plan)
        self._forget(batch.drop(lambda s: s.job.cancelled is None))
        admitted = plan.admit
        t0 = time.perf_counter()
        try:
            if admitted:
                self.observer.batch_started(len(admitted), [now - s.job.enqueued for s in admitted])
                if plan.encode:
                    e0 = time.time_ns()
                    encodings = batch.encode([s.ids for s in plan.encode])
                    ran = (e0, time.time_ns())
                    for s, enc in zip(plan.encode, encodings, strict=True):
                        s.encoded, s.encoder = enc, ran
                encoded = []
                for s in admitted:
                    assert s.encoded is not None
                    encoded.append(s.encoded)
                    s.encoded = None  # the batch holds its copy now
                batch.join_encoded(encoded, [s.search for s in admitted], admitted)
                joined = Mark(time.time_ns(), batch.rows, self.steps)
                for s in admitted:
                    s.joined = joined
            loaded = batch.rows * 2 >= self.limits.max_rows
            finished = batch.step()
            rows = batch.stepped_rows
        except Exception as exc:  # a failing step fails the sentences it held, nothing else
            log.exception("stepper %s: decoder step failed", self.name)
            answered = set()
            others: list[tuple[Sentence, list[Hypothesis]]] = exc.finished if isinstance(exc, StepError) else []
            for sent, hyps in others:  # what another shard finished in the failing step
                answered.add(id(sent))
                self._finish(sent, hyps)
            held = {id(s): s for s in [*batch.drop(lambda s: False), *admitted] if id(s) not in answered}
            failed = list(held.values())
            self._fail_jobs({s.job for s in failed}, exc)
            self._forget(failed)
            return True
        if rows:
            measured = self._span.add(loaded, rows, time.perf_counter() - t0)
            if measured:
                self.admission.measure(*measured)
            self.steps += 1
        left = Mark(time.time_ns(), rows, self.steps) if finished else None
        for s, hyps in finished:
            s.left = left
            self._finish(s, hyps)
        self.observer.active(len(batch.blocks), batch.rows)
        return True

    def _apply(self, plan: policy.Plan) -> None:
        """Takes the policy's decision into the queue (under the lock)."""
        for job in plan.evict:
            if job.cancelled is None:
                job.cancelled = CancelReason.DEADLINE
        for job, admitted in plan.admitted.items():
            job.admitted = admitted
        self._waiting = deque(plan.waiting)

    def _forget(self, gone: Sequence[Sentence]) -> None:
        """Accounts for sentences that left without finishing, and answers their jobs."""
        with self._cv:
            jobs = {s.job for s in gone}
            for job in list(self._jobs):  # waiting sentences of cancelled jobs leave too
                if job.cancelled is not None:
                    jobs.add(job)
            by_reason: dict[CancelReason, int] = {}
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
                reason = job.cancelled or CancelReason.ERROR
                by_reason[reason] = by_reason.get(reason, 0) + left
                if job.cancelled == CancelReason.DEADLINE:
                    job.reply(DeadlineExceeded("the request deadline passed before its translation finished"))
                elif job.cancelled == CancelReason.SHUTDOWN:
                    job.reply(ShuttingDown(f"model {self.name} shut down before this request finished"))
            depth = self._depth()
        for reason, n in by_reason.items():
            self.observer.cancelled(reason.value, n)
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
                job.reply(job.results)

    def _fail_jobs(self, jobs: set[Job], exc: Exception) -> None:
        with self._cv:
            for job in jobs:
                if job.cancelled is None:
                    job.cancelled = CancelReason.ERROR
                job.reply(exc)

    def _depth(self) -> int:
        """Sentences waiting to be admitted (under the lock)."""
        return sum(len(j.sentences) - j.admitted for j in self._waiting)


def _replier(
    loop: asyncio.AbstractEventLoop, future: asyncio.Future[list[list[Hypothesis]]]
) -> Callable[[Outcome], None]:
    """A job's answer, settled on the event loop that waits for it (from any thread)."""

    def settle(outcome: Outcome) -> None:
        if future.done():
            return
        if isinstance(outcome, BaseException):
            future.set_exception(outcome)
        else:
            future.set_result(outcome)

    def reply(outcome: Outcome) -> None:
        loop.call_soon_threadsafe(settle, outcome)

    return reply


class _Expired(Exception):
    """A job's deadline passed while its caller waited."""


def _expire(future: asyncio.Future[list[list[Hypothesis]]]) -> None:
    if not future.done():
        future.set_exception(_Expired())
