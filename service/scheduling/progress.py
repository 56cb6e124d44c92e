"""A request's progress, as the step scheduler publishes it: per source (a request's sentence or
whole text), each token its rows choose (greedy and sampled rows: `Tokens`) and its hypotheses
when it ends (`Finished`; a beam's only event). As vLLM's engine emits a `RequestOutput` per step
and the final answer is the last of them, a one-shot answer is read from the same events as a
stream: `StepScheduler.submit` collects the `Finished` events of `StepScheduler.stream`.

A `Channel` carries one request's events from the scheduler thread to its reader on the event
loop. A live channel (a stream) wakes its reader at each step that has news; a one-shot channel
keeps them until the request ends, then wakes its reader once: the scheduler thread hands the
loop one callback per request, as it did before there were events. Knows nothing about models
or HTTP.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from service.engine.decoding import Hypothesis


@dataclass(frozen=True)
class Tokens:
    """The tokens one row of a source chose since its last event, in order (their concatenation
    is the row's hypothesis without EOS; a sampled source's hypotheses are its rows, best first
    in `Finished`)."""

    source: int  # the source's place in its request
    row: int  # 0 for greedy; a sampled source's draw
    ids: tuple[int, ...]


@dataclass(frozen=True)
class Finished:
    """A source's hypotheses, best first: its last event."""

    source: int
    hypotheses: list[Hypothesis]


Event = Tokens | Finished


class Sink(Protocol):
    """Where the scheduler thread publishes one request's events."""

    def publish(self, events: Sequence[Event]) -> None: ...

    def close(self, error: BaseException | None = None) -> None:
        """The last call: the request ended (`error`: how it failed)."""


class NoSink:
    """A request nobody reads (built by a test)."""

    def publish(self, events: Sequence[Event]) -> None:
        pass

    def close(self, error: BaseException | None = None) -> None:
        pass


class Channel:
    """One request's events from the scheduler thread (`publish`, `close`) to one reader on the
    event loop `loop` (`read`). `live`: the reader wakes at every publication; otherwise once, at
    `close`, with every event in order. `fail` ends it from the loop itself (a deadline)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, live: bool) -> None:
        self.loop, self.live = loop, live
        self._held: list[Event] = []  # the scheduler thread's, until `close` (one-shot)
        self._ready: list[Event] = []  # the loop's, until read
        self._ended = False
        self._error: BaseException | None = None
        self._waiter: asyncio.Future[None] | None = None

    # -- the scheduler thread --------------------------------------------------------------------

    def publish(self, events: Sequence[Event]) -> None:
        if not events:
            return
        if self.live:
            self.loop.call_soon_threadsafe(self._deliver, list(events), False, None)
        else:
            self._held += events

    def close(self, error: BaseException | None = None) -> None:
        held, self._held = self._held, []
        self.loop.call_soon_threadsafe(self._deliver, held, True, error)

    # -- the event loop --------------------------------------------------------------------------

    def fail(self, error: BaseException) -> None:
        """Ends the channel now, whatever the scheduler thread publishes after."""
        self._deliver([], True, error)

    def _deliver(self, events: list[Event], end: bool, error: BaseException | None) -> None:
        if self._ended:
            return
        self._ready += events
        if end:
            self._ended, self._error = True, error
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    async def read(self) -> list[Event]:
        """The events published since the last read, in order; [] once ended; raises how it failed."""
        while not self._ready and not self._ended:
            self._waiter = self.loop.create_future()
            await self._waiter
        events, self._ready = self._ready, []
        if not events and self._error is not None:
            raise self._error
        return events
