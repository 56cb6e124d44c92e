"""Cost-aware admission, one object per queue (the classifier's batcher, each translator's step
scheduler): a request is refused at once (`QueueFull`, 429 with a Retry-After) when the queue
cannot hold it now (`PayloadTooLarge`, 413, when it never could), or when it would not be
answered within `admit_share` of its deadline at the throughput the queue measured: the batcher
serves first come first served, so its request waits for the work already admitted and its own
(`check_time`); the step scheduler's request waits its turns under the step policy
(`policy.expected_wait`, `check_wait`). Under overload a client then gets a fast 429 instead
of a 504 after waiting. Knows nothing about models or HTTP.

Work is counted in the owner's units (the batcher's item sizes; the step scheduler's row-steps,
`estimate_work`); the owner keeps the count of work admitted and not yet done.
"""

from __future__ import annotations

import math

from service.errors import PayloadTooLarge, QueueFull


def estimate_work(source_tokens: int, width: int, limit: int) -> int:
    """Row-steps a sentence is expected to cost: its rows times a target length guess (about
    twice the source, never above its limit)."""
    return width * min(limit, 2 * source_tokens + 8)


class LoadedSpan:
    """The step scheduler's throughput under load: rows over the time of every step and encoder
    run while the batch holds at least half its rows, measured at each step that ran that many.
    The express lane's small steps and the encoding of joining sentences then count against the
    main batch's rows, as they do for the work admitted behind them; a step alone would promise
    up to twice the throughput while the express lane takes its share."""

    def __init__(self, max_rows: int) -> None:
        self.max_rows = max_rows
        self.rows, self.seconds = 0, 0.0

    def add(self, loaded: bool, rows: int, seconds: float) -> tuple[int, float] | None:
        """Takes one step (`loaded`: the batch held half its rows); returns (rows, seconds) to
        measure when the step itself ran that many rows."""
        if not loaded:
            self.rows, self.seconds = 0, 0.0
            return None
        self.rows += rows
        self.seconds += seconds
        if rows * 2 < self.max_rows:
            return None
        span = self.rows, self.seconds
        self.rows, self.seconds = 0, 0.0
        return span


class Admission:
    """The refusals and the throughput they rest on. Not locked: the owner calls it from one
    place at a time (the event loop, or under its own lock)."""

    def __init__(self, name: str, max_queue: int, admit_share: float, unit: str) -> None:
        self.name, self.max_queue, self.admit_share, self.unit = name, max_queue, admit_share, unit
        self.rate: float | None = None  # work units per second, a moving average of measured runs

    def check_room(self, queued: int, more: int) -> None:
        """QueueFull when `more` entries (items, sentences) would overflow the queue's `queued`;
        PayloadTooLarge when they could never fit, however long the client waited."""
        if more > self.max_queue:
            raise PayloadTooLarge(
                f"the request has {more} {self.unit}; model {self.name} queues at most {self.max_queue}: split it"
            )
        if queued + more > self.max_queue:
            raise QueueFull(f"model {self.name} has {queued} of {self.max_queue} {self.unit} queued; retry later")

    def check_time(self, queued_work: float, work: float, time_left: float) -> None:
        """QueueFull when the queued work plus `work` would not finish within `admit_share` of
        `time_left` at the measured throughput: first come first served, the batcher's order."""
        if self.rate and queued_work:
            self.check_wait((queued_work + work) / self.rate, time_left, queued_work, what="of queued work")

    def check_wait(
        self, seconds: float, time_left: float, queued_work: float, crowds: bool = False, what: str = "in its turn"
    ) -> None:
        """QueueFull when a request's expected wait (`seconds`, its owner's estimate under its own
        order of service at `rate`; `what` says which) exceeds `admit_share` of `time_left`, or
        when admitting it would make work already queued late (`crowds`). Retry-After: the time
        `queued_work` needs. An idle queue admits anything (the owner asks only with a rate and
        queued work): one request alone runs as fast as it can, whatever the estimate says."""
        if seconds > self.admit_share * time_left:
            reason = f"about {seconds:.1f} s {what}, more than this request's deadline allows"
        elif crowds:
            reason = "this request's turns would make requests queued before it miss their deadlines"
        else:
            return
        error = QueueFull(f"model {self.name} is busy: {reason}; retry later")
        error.retry_after = max(1, math.ceil(queued_work / self.rate)) if self.rate else 1
        raise error

    def measure(self, work: float, seconds: float) -> None:
        """Adds one run's throughput to the moving average (the caller picks runs that say something
        about a loaded queue)."""
        if work and seconds > 0:
            rate = work / seconds
            self.rate = rate if self.rate is None else 0.8 * self.rate + 0.2 * rate
