"""Step-level (continuous) batching for a translator: sentences join and leave the running batch
at every decoder step. Knows nothing about HTTP.

One thread per translator loops: ask the policy (`policy.plan`) which waiting sentences join and
which requests leave, drop what was cancelled or expired, encode the sentences that join (one
encoder run, which also encodes some of those likely to join next), run one decoder step for
every active row (of the lane the policy chose, `policy.next_lane`, when the batch has lanes),
publish what the step produced (`progress`: the tokens of watched rows, the sentences that
finished). Greedy, beam and sampled sentences with any parameters share the same steps; each
sentence's `Search` keeps it independent of its neighbours. The batch may be any `DecoderBatch`
(one running batch, shards on threads, or two lanes of them: `LaneBatch`).

Admission (`Admission`, as the classifier's batcher) refuses a request at once (`QueueFull`,
429) when the queued sentences would overflow `max_queue`, or when the request would not be
answered before its deadline waiting its turns under the policy, or would make a request
waiting before it late (`policy.expected_wait`: its sentences among the others' round-robin
turns, in its lane, not the whole queue's work), at the throughput measured while the batch is
at least half full (rows over the time of every step and encoder run, the express lane's
included); work is estimated in row-steps (rows x expected tokens). A request whose reader left
(its awaiting task is cancelled, or it closed its stream), whose deadline passed, or that is
still running at shutdown leaves the batch at the next step.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import deque
from collections.abc import AsyncGenerator, Callable, Sequence
from typing import Protocol

from service.engine.decoding import DecodeParams, Hypothesis, Search
from service.engine.running import DecoderBatch, LaneBatch, StepError
from service.errors import DeadlineExceeded, InputTooLong, InvalidInput, NotReady, ShuttingDown
from service.priority import lower_priority
from service.scheduling import policy
from service.scheduling.admission import Admission, LoadedSpan, estimate_work
from service.scheduling.policy import CancelReason, Job, Mark, Sentence, StepLimits, Usage
from service.scheduling.progress import Channel, Event, Finished, Tokens

__all__ = ["CancelReason", "Job", "Sentence", "StepLimits", "StepObserver", "StepScheduler"]

log = logging.getLogger(__name__)

_BACKLOG_S = 0.01  # admission builds its backlog anew at most this often (about a step): building one
# reads every unanswered request; the jobs admitted meanwhile count whole in a new request's turns


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
        self._watched: dict[Sentence, list[int]] = {}  # the scheduler thread's: admitted sentences whose
        # tokens are published, and how many of each row's were
        self._span = LoadedSpan(limits.max_rows)
        self._backlog: policy.Backlog | None = None  # the queue as admission weighs it (`_check_wait`)
        self._since: list[Job] = []  # the jobs admitted since it was built
        self._changed = False  # whether anything else changed since

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
        """Hypotheses per item (source ids with EOS, its search) once every item is done: the
        `Finished` events of `stream`, the same events a stream reads."""
        results: list[list[Hypothesis]] = [[] for _ in items]
        async for events in self.stream(items, deadline, seen=seen):
            for event in events:
                if isinstance(event, Finished):
                    results[event.source] = event.hypotheses
        return results

    async def stream(
        self,
        items: Sequence[tuple[Sequence[int], Search]],
        deadline: float,
        tokens: bool = False,
        seen: list[Job] | None = None,
    ) -> AsyncGenerator[list[Event], None]:
        """The items' events as they come, step by step (`tokens`: also each token their greedy
        and sampled rows choose, `progress.Tokens`; else only each item's `Finished`, all at the
        end), until every item has finished. A reader that stops reading (cancelled, or it closes
        the stream: `contextlib.aclosing`) takes its sentences out of the batch at the next step. The
        job is added to `seen`, if given (a trace reads its sentences' marks)."""
        if self._thread is None:
            raise NotReady(f"model {self.name} is not started")
        loop = asyncio.get_running_loop()
        now = time.monotonic()
        if deadline <= now:
            raise DeadlineExceeded("the request deadline passed before it was queued")
        channel = Channel(loop, live=tokens)
        job = Job(deadline, now, channel, tokens)
        for i, (ids, search) in enumerate(items):
            work = estimate_work(len(ids), search.width, search.limit)
            reserve = search.width * (len(ids) + search.limit)
            job.sentences.append(Sentence(job, i, ids, search, work, reserve))
            if tokens:
                search.watch()
        answered: list[Event] = [Finished(s.index, s.search.hypotheses()) for s in job.sentences if s.search.done]
        job.remaining = len(items) - len(answered)
        if seen is not None:
            seen.append(job)
        job.work = sum(s.work for s in job.sentences if not s.search.done)
        if not job.remaining:
            yield answered
            return
        with self._cv:
            self._admit_job(job, now)
            self._jobs.add(job)
            self._waiting.append(job)
            self._since.append(job)
            self._changed = True
            self._cv.notify()
            depth = self._depth()
        self.observer.queue_depth(depth)
        # The deadline holds here too, even while the scheduler thread is inside a long step: it
        # ends the channel itself. The scheduler's answer after that is ignored.
        timer = loop.call_later(job.deadline - time.monotonic(), channel.fail, _Expired())
        ended = False
        try:
            if answered:
                yield answered
            while events := await channel.read():
                yield events
            ended = True
        except _Expired:
            self._cancel(job, CancelReason.DEADLINE)
            where = "while queued" if job.admitted == 0 else "while running"
            raise DeadlineExceeded(f"the request deadline passed {where}") from None
        finally:
            timer.cancel()
            if not ended:  # its reader went away (cancelled, closed) or it failed: nothing left to do
                self._cancel(job, CancelReason.DISCONNECT)

    def _cancel(self, job: Job, reason: CancelReason) -> None:
        """Marks a job that nobody waits for any more; its sentences leave at the next step."""
        with self._cv:
            if job.cancelled is None:
                job.cancelled = reason
                self._changed = True
                self._cv.notify()

    def refuse_if_busy(self, deadline: float) -> None:
        """Raises the QueueFull any request would get now: even the cheapest, one greedy sentence
        of one step (`_probe`), would not be answered in its turn within the deadline's share.
        Checked before a request's texts are split and tokenized, so an overloaded server refuses
        at the cost of reading the JSON, not of preparing the texts."""
        probe = _probe(deadline)
        with self._cv:
            self._check_wait(probe, time.monotonic())

    def _check_wait(self, job: Job, now: float) -> None:
        """QueueFull when `job` would not be answered in its deadline's share waiting its turns
        under the policy among the unanswered jobs, or would make a waiting one late
        (`policy.expected_wait`; under the lock). An idle queue admits anything."""
        rate = self.admission.rate
        if rate and self._work:
            queued = self._backlog
            if queued is None or self._changed and now - queued.at > _BACKLOG_S:
                queued = self._backlog = policy.backlog(self._jobs, self.limits, rate, now)
                self._since.clear()
                self._changed = False
            wait = policy.expected_wait(queued, job, self.limits, self._since)
            self.admission.check_wait(wait.seconds, job.deadline - now, self._work, wait.crowds)

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
        self._check_wait(job, now)
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
            express_rows = batch.express.rows if isinstance(batch, LaneBatch) else 0
            running = Usage(batch.rows - express_rows, sum(b.tag.reserve for b in batch.blocks), express_rows)
            plan = policy.plan(self._waiting, self._jobs, running, self.limits, now)
            self._apply(plan)
        self._forget(batch.drop(lambda s: s.job.cancelled is None))
        admitted = plan.admit
        lanes = batch if isinstance(batch, LaneBatch) else None  # the policy chooses its lanes
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
                    if s.search.chosen is not None:
                        self._watched[s] = [0] * len(s.search.chosen)
                searches = [s.search for s in admitted]
                if lanes is not None:
                    lanes.join_encoded(encoded, searches, admitted, plan.lanes)
                else:
                    batch.join_encoded(encoded, searches, admitted)
                joined = Mark(time.time_ns(), batch.rows, self.steps)
                for s in admitted:
                    s.joined = joined
            loaded = batch.rows * 2 >= self.limits.max_rows
            finished = batch.step() if lanes is None else lanes.step(policy.next_lane(lanes.load, self.limits))
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
        if self._watched:
            self._publish_tokens()
        self.observer.active(len(batch.blocks), batch.rows)
        return True

    def _publish_tokens(self) -> None:
        """Each watched row's tokens since its last event, one publication per job (the batch's
        shards may have stepped on their own threads: their rows' lists only grow)."""
        by_job: dict[Job, list[Event]] = {}
        for s, shown in self._watched.items():
            if events := _new_tokens(s, shown):
                by_job.setdefault(s.job, []).extend(events)
        for job, events in by_job.items():
            job.sink.publish(events)

    def _apply(self, plan: policy.Plan) -> None:
        """Takes the policy's decision into the queue (under the lock)."""
        for job in plan.evict:
            if job.cancelled is None:
                job.cancelled = CancelReason.DEADLINE
        for job, admitted in plan.admitted.items():
            job.admitted = admitted
        self._waiting = deque(plan.waiting)
        self._changed = True

    def _forget(self, gone: Sequence[Sentence]) -> None:
        """Accounts for sentences that left without finishing, and answers their jobs."""
        for s in gone:
            self._watched.pop(s, None)
        with self._cv:
            jobs = {s.job for s in gone}
            self._changed = True
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
                    job.sink.close(DeadlineExceeded("the request deadline passed before its translation finished"))
                elif job.cancelled == CancelReason.SHUTDOWN:
                    job.sink.close(ShuttingDown(f"model {self.name} shut down before this request finished"))
            depth = self._depth()
        for reason, n in by_reason.items():
            self.observer.cancelled(reason.value, n)
        self.observer.queue_depth(depth)

    def _finish(self, s: Sentence, hyps: list[Hypothesis]) -> None:
        """Publishes a finished sentence (after its last tokens); the job's last ends its channel."""
        job = s.job
        self.observer.generated(len(hyps[0].tokens) + int(hyps[0].finished) if hyps else 0)
        shown = self._watched.pop(s, None)
        with self._cv:
            if job not in self._jobs:
                return
            job.remaining -= 1
            self._changed = True
            self._sentences -= 1
            self._work -= s.work
            last = job.remaining == 0
            if last:
                self._jobs.discard(job)
        job.sink.publish([*(_new_tokens(s, shown) if shown is not None else ()), Finished(s.index, hyps)])
        if last:
            job.sink.close()

    def _fail_jobs(self, jobs: set[Job], exc: Exception) -> None:
        for s in [s for s in self._watched if s.job in jobs]:
            del self._watched[s]
        with self._cv:
            self._changed = True
            for job in jobs:
                if job.cancelled is None:
                    job.cancelled = CancelReason.ERROR
                job.sink.close(exc)

    def _depth(self) -> int:
        """Sentences waiting to be admitted (under the lock)."""
        return sum(len(j.sentences) - j.admitted for j in self._waiting)


_PROBE = Search(DecodeParams(beam_size=1, max_new_tokens=1), 0, 1)  # `_probe`'s sentence: read, never stepped


def _probe(deadline: float) -> Job:
    """The cheapest request there is, as far as the estimate goes: one greedy sentence of one step."""
    job = Job(deadline, 0.0)
    job.sentences = [Sentence(job, 0, (), _PROBE, estimate_work(0, 1, 1), 0)]
    job.remaining, job.work = 1, job.sentences[0].work
    return job


def _new_tokens(s: Sentence, shown: list[int]) -> list[Event]:
    """A watched sentence's tokens chosen since `shown` (per row: how many were published), which it moves on."""
    chosen = s.search.chosen
    assert chosen is not None
    out: list[Event] = []
    for row, ids in enumerate(chosen):
        n = len(ids)  # read once: a shard's thread may append meanwhile
        if n > shown[row]:
            out.append(Tokens(s.index, row, tuple(ids[shown[row] : n])))
            shown[row] = n
    return out


class _Expired(Exception):
    """A job's deadline passed while its caller waited."""
