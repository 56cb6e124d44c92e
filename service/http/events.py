"""A streamed answer: a task's events as Server-Sent Events (`text/event-stream`).

The pipeline runs as for any answer up to the run (admission, deadline, limits, model, options):
what it refuses is the ordinary JSON error. The run becomes the stream: its events go out as
`data: <json>` lines, then `data: [DONE]`. The headers wait for the first event, so an error
before it (the queue full, the deadline passed while queued) is still the JSON error with its
status; after it, an error is an event `data: {"error": ..., "type": ...}` and the stream ends.

The scheduler never waits for a reader: the events go through a buffer of
`stream_buffer_events`; a reader that falls that far behind has its request cancelled (its rows
leave at the next step) and gets an error event once it reads again. A reader that leaves
(`http.disconnect`) has its request cancelled the same way.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import AsyncIterator, Mapping

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service.errors import ServiceError
from service.http.errors import InternalError, answer_error, error_body
from service.http.limits import hold
from service.http.scope import request_info
from service.http.state import scope_state
from service.http.table import Protocol, route_of

log = logging.getLogger(__name__)

MEDIA_TYPE = "text/event-stream"
HEADERS = [
    (b"content-type", b"text/event-stream; charset=utf-8"),
    (b"cache-control", b"no-cache"),
    (b"x-accel-buffering", b"no"),  # a proxy in front (nginx) passes each event on at once
]
DONE = b"data: [DONE]\n\n"


class SlowReader(ServiceError):
    """The reader fell a whole buffer of events behind the model."""

    kind = "slow_reader"
    status = 503


def event(data: Mapping[str, object]) -> bytes:
    """One Server-Sent Event: `data:` and one line of JSON (JSON escapes every line break)."""
    return b"data: " + json.dumps(data, ensure_ascii=False, separators=(",", ":")).encode() + b"\n\n"


def error_event(exc: BaseException, protocol: Protocol) -> bytes:
    """An error after the first byte, in the shape of the route's JSON errors."""
    if not isinstance(exc, ServiceError):
        log.error("a streamed answer failed", exc_info=exc)
        exc = InternalError("internal error")
    return event(error_body(protocol, exc))


_END = object()  # the producer's last item: the stream is complete


def event_stream(events: AsyncIterator[Mapping[str, object]], protocol: Protocol) -> ASGIApp:
    """The ASGI answer that streams `events` (an async generator: closed when the reader leaves)."""

    async def send_events(scope: Scope, receive: Receive, send: Send) -> None:
        state = scope_state(scope)
        route = route_of(scope)
        endpoint = route.metric or route.path if route is not None else ""
        metrics, bound = state.metrics, state.settings.stream_buffer_events
        items: asyncio.Queue[object] = asyncio.Queue()

        async def produce() -> None:
            try:
                async with contextlib.aclosing(events) as source:  # type: ignore[type-var]
                    async for data in source:
                        while items.qsize() >= bound and not sender.blocked:  # a burst: the sender's turn
                            sender.took.clear()
                            await sender.took.wait()
                        if items.qsize() >= bound:  # a buffer behind a blocked reader: the model does not wait
                            metrics.streams_cut.labels(endpoint).inc()
                            items.put_nowait(SlowReader("the client read too slowly; the request was cancelled"))
                            return
                        items.put_nowait(event(data))
            except Exception as exc:  # becomes the JSON error or an error event
                items.put_nowait(exc)
                return
            items.put_nowait(_END)

        sender = _Sender(send)
        producer = asyncio.create_task(produce())
        watcher = asyncio.create_task(_until_disconnect(receive))
        try:
            first = await _next(items, watcher, sender)
            if first is None:
                return
            if isinstance(first, BaseException):
                if not isinstance(first, ServiceError):
                    raise first
                await hold(first, state.settings.limit_hold_s)
                await answer_error(protocol, first)(scope, receive, send)
                return
            metrics.first_event.labels(endpoint).observe(time.monotonic() - request_info(scope).start)
            await send({"type": "http.response.start", "status": 200, "headers": HEADERS})
            gauge = metrics.streams.labels(endpoint)
            gauge.inc()
            try:
                item = first
                while item is not None:
                    if item is _END:
                        await sender.body(DONE, more=False)
                        return
                    if isinstance(item, BaseException):
                        await sender.body(error_event(item, protocol), more=False)
                        return
                    assert isinstance(item, bytes)
                    await sender.body(item, more=True)
                    item = await _next(items, watcher, sender)
            finally:
                gauge.dec()
        finally:
            producer.cancel()  # a reader that left: its request is cancelled, its rows freed at the next step
            watcher.cancel()
            await asyncio.gather(producer, watcher, return_exceptions=True)

    return send_events


class _Sender:
    """The answer's side: whether it is inside a send the reader holds up (`blocked`), and each item it takes."""

    def __init__(self, send: Send) -> None:
        self.send, self.blocked, self.took = send, False, asyncio.Event()

    async def body(self, body: bytes, more: bool) -> None:
        message: Message = {"type": "http.response.body", "body": body, "more_body": more}
        self.blocked = True  # only while suspended in it does the producer see this
        try:
            await self.send(message)
        finally:
            self.blocked = False


async def _next(items: asyncio.Queue[object], watcher: asyncio.Task[None], sender: _Sender) -> object | None:
    """The producer's next item, or None once the reader has left."""
    sender.took.set()  # ready for more: a producer held at the bound goes on
    if not items.empty():
        return items.get_nowait()
    getter = asyncio.ensure_future(items.get())
    await asyncio.wait({getter, watcher}, return_when=asyncio.FIRST_COMPLETED)
    if getter.done():
        return getter.result()
    getter.cancel()
    return None


async def _until_disconnect(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass
