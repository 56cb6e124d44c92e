"""The one path of every request that runs a model, whatever protocol it speaks.

A protocol is a codec (`Codec`), in the spirit of LitServe's `decode_request`/`encode_response`
around one loop: it decodes the request into what the client asks for (`Decoded`: its request,
the texts it is charged for, its own timeout option), builds the task's protocol-neutral `Work`
once the model is known, and encodes the task's result as its answer. Everything else is here,
in this order, for every protocol:

1. admission: 503 once the service closes;
2. the codec decodes the request (its parse, its key, its own checks: 400, 403, 413, 422);
3. the deadline: from the request's arrival (`RequestInfo.start`), the codec's budget (the
   settings' request or file timeout), only ever shortened by the protocol's timeout option;
4. per-client limits and charging (413, 429);
5. model resolution (404, 422, 503), the model named in the access log and metrics;
6. the codec's work for that model (its options checked against it: 422);
7. the run (the task's queue: 429, 504), then the codec's answer; a streamed answer
   (`service.http.events`) is the run itself, its headers sent with its first event.

With tracing on (`service.tracing`), `serve` wraps the same path in the request's SERVER span
(`traced`): the work carries it (`Work.trace`), so the task's run adds its parts as children however
the codec runs it (a stream's span ends once the stream is sent); an error or a client gone is an
event on it. With tracing off, the one check of `serve` is all that runs of it; so with a sampler that
keeps no request without a sampled caller (ratio 0), for a request that names none.

A domain error raised anywhere is answered in the route's protocol by `dispatch.Endpoint`. A
codec is the route's handler (`Route.handler`): the dispatcher calls `serve` through it, with no
layer between. A route that runs a model declares a codec; tests/test_structure.py checks that
none runs a task or charges a client another way.
"""

from __future__ import annotations

import asyncio
import time
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Generic, TypeVar, cast

from opentelemetry.util.types import AttributeValue
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service.errors import DeadlineExceeded, QueueFull, RateLimited, ServiceError, ShuttingDown
from service.http.scope import Call, request_info
from service.http.state import scope_state
from service.http.table import Auth, Protocol, route_of
from service.serving import ModelSet
from service.settings import Settings
from service.tasks.base import Task, Work
from service.tracing import Trace, Tracing, carries_context, server_span

D = TypeVar("D")  # a protocol's decoded request
R = TypeVar("R")  # the result of the task the codec is typed against
Out = TypeVar("Out")  # what the codec's run gives its encoder

Run = Callable[[Work], Awaitable[R]]
"""The task's run, as the pipeline hands it to a codec's `execute`."""


@dataclass(frozen=True, slots=True)
class Decoded(Generic[D]):
    """A request as its codec read it, before any model is chosen."""

    request: D  # the protocol's own form of it: what `resolve`, `work` and `encode` read
    texts: Sequence[str]  # what the client is charged for (per-client limits)
    timeout_s: float | None = None  # the protocol's timeout option: shortens the deadline, never lengthens it


async def serve(codec: Codec[Any, Any, Any], call: Call) -> ASGIApp:
    """The request's answer: the one pipeline (this module's docstring has the order)."""
    tracing = scope_state(call.scope).tracing
    if tracing is None or (tracing.roots_dropped and not carries_context(call.scope.get("headers", ()))):
        return await _serve(codec, call, None)
    return await traced(codec, call, tracing)


async def _serve(codec: Codec[Any, Any, Any], call: Call, trace: Trace | None) -> ASGIApp:
    scope = call.scope
    state = scope_state(scope)
    if state.closing:
        raise ShuttingDown("the service is shutting down; retry on another instance")
    info = request_info(scope)
    settings = state.settings
    decoded = await codec.decode(call, settings)
    budget = codec.budget_s(settings)
    if decoded.timeout_s is not None and decoded.timeout_s < budget:
        budget = decoded.timeout_s
    deadline = info.start + budget
    limits = state.limits
    if limits.active:
        route = route_of(scope)
        if route is not None and route.auth is Auth.PARAM:  # its key was in the body: only now is its client known
            limits.request(scope)
        limits.texts(scope, decoded.texts)
    task = codec.resolve(decoded.request, state.models)
    info.model = task.entry.name
    work = codec.work(decoded.request, task, deadline)
    if trace is None:
        done = await codec.execute(decoded.request, task.run, work)
    else:
        done = await _execute_traced(codec, decoded.request, task, work, trace)
    return await codec.encode(decoded.request, task, done)


async def traced(codec: Codec[Any, Any, Any], call: Call, tracing: Tracing) -> ASGIApp:
    """`_serve` in the request's SERVER span, named after its route (`POST /translate`), with the
    HTTP semantic conventions' attributes; it continues the caller's W3C trace context."""
    scope = call.scope
    info = request_info(scope)
    route = route_of(scope)
    method = str(scope.get("method", ""))
    template = route.path if route is not None else ""
    arrived = time.time_ns() - int((time.monotonic() - info.start) * 1e9)
    trace = server_span(tracing, scope, method, template, info.request_id, arrived)
    if trace is None:  # sampled out: the request runs as untraced, its trace id no exemplar
        return await _serve(codec, call, None)
    info.trace_id = trace.trace_id
    protocol = route.protocol if route is not None else Protocol.REST
    stream = False  # a stream's span ends once it is sent (`_sent`), not here
    try:
        answer = await _serve(codec, call, trace)
        if trace.streamed:
            stream = True
            return _sent(answer, trace)
    except ServiceError as exc:
        status = protocol.status(exc.status)
        trace.event(_EVENTS.get(type(exc), "error"), {"reason": str(exc), "error.type": type(exc).__name__})
        trace.set({"http.response.status_code": status, "error.type": type(exc).__name__})
        if status >= 500:
            trace.fail(str(exc))
        raise
    except asyncio.CancelledError:
        trace.event("cancelled", {"reason": "the client disconnected"})
        trace.set({"error.type": "cancelled"})
        raise
    except Exception as exc:
        trace.event("exception", {"exception.type": type(exc).__name__, "exception.message": str(exc)})
        trace.set({"http.response.status_code": 500, "error.type": type(exc).__name__})
        trace.fail(type(exc).__name__)
        raise
    else:
        trace.set({"http.response.status_code": 200})
    finally:
        if not stream:
            trace.end()
    return answer


def _sent(answer: ASGIApp, trace: Trace) -> ASGIApp:
    """A streamed answer in the request's span: the stream runs the work (its parts the span's
    children), the status is the one it starts with, and the span ends once it is sent."""

    async def send_traced(scope: Scope, receive: Receive, send: Send) -> None:
        async def sending(message: Message) -> None:
            if message["type"] == "http.response.start":
                status = message["status"]
                trace.set({"http.response.status_code": status})
                if status >= 500:
                    trace.fail(f"HTTP {status}")
            await send(message)

        try:
            await answer(scope, receive, sending)
        except asyncio.CancelledError:
            trace.event("cancelled", {"reason": "the client disconnected"})
            trace.set({"error.type": "cancelled"})
            raise
        finally:
            trace.end()

    return send_traced


_EVENTS: dict[type[ServiceError], str] = {
    DeadlineExceeded: "deadline",
    QueueFull: "refused",
    RateLimited: "refused",
    ShuttingDown: "refused",
}
"""The span event of an error that ends a request (others: `error`)."""


async def _execute_traced(codec: Codec[D, R, Out], request: D, task: Task[Any, R], work: Work, trace: Trace) -> Out:
    """`codec.execute` with the work traced (`Work.trace`): the model named on the span, the run's
    parts its children however the codec runs it (at once, in `encode`, or as a stream); a
    document's runs are one `document` span with its segment counts."""
    trace.set(
        {
            "transformer_serve.model": task.entry.name,
            "transformer_serve.model_version": task.entry.version,
            "transformer_serve.task": task.name,
        }
    )
    document = codec.document_attributes(request)
    if document is None:
        trace.set({"transformer_serve.texts": len(work.texts) or len(work.pairs)})
        trace.streamed = codec.streams(request)
        return await codec.execute(request, task.run, replace(work, trace=trace))
    start = time.time_ns()
    try:
        return await codec.execute(request, task.run, work)
    finally:
        trace.child("document", start, time.time_ns(), document)


class Codec(ABC, Generic[D, R, Out]):
    """One protocol's side of the pipeline: `D` its decoded request, `R` the result of the task it
    is typed against, `Out` what its run gives the encoder (`R` itself, but for a document's)."""

    __call__ = serve  # a codec is its route's handler: the pipeline, with this codec

    def budget_s(self, settings: Settings) -> float:
        """The longest the request may take, from its arrival: the settings' request timeout."""
        return settings.request_timeout_s

    @abstractmethod
    async def decode(self, call: Call, settings: Settings) -> Decoded[D]:
        """The request as the protocol gives it: parsed and checked, its texts within the limits."""

    @abstractmethod
    def resolve(self, request: D, models: ModelSet) -> Task[Any, R]:
        """The ready model the request names (or the default one)."""

    @abstractmethod
    def work(self, request: D, task: Task[Any, R], deadline: float) -> Work:
        """The request as the task's protocol-neutral work, its options checked against `task`."""

    async def execute(self, request: D, run: Run[R], work: Work) -> Out:
        """The work run: once, as here (`Out` is `R`); a codec overrides it to run it not at all
        (nothing to run), in parts, or as a stream."""
        return cast(Out, await run(work))

    def streams(self, request: D) -> bool:
        """Whether the answer is a stream that runs the work after the pipeline has returned it:
        the request's span then ends once the stream is sent (`traced`)."""
        return False

    def document_attributes(self, request: D) -> Mapping[str, AttributeValue] | None:
        """A document's trace attributes (its segment counts), traced as one span; None: not a document."""
        return None

    @abstractmethod
    async def encode(self, request: D, task: Task[Any, R], done: Out) -> ASGIApp:
        """The protocol's answer."""
