"""OpenTelemetry traces, exported over OTLP: off unless the SDK's standard variables name a collector.

The OpenTelemetry SDK reads its own variables (the one exception to `service.settings` reading the
environment): `OTEL_EXPORTER_OTLP_ENDPOINT` or `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` turns tracing on
(`OTEL_SDK_DISABLED=true` keeps it off); `OTEL_EXPORTER_OTLP_PROTOCOL` (or `_TRACES_PROTOCOL`) picks
`http/protobuf` (default) or `grpc`; `OTEL_SERVICE_NAME` (default `transformer-serve`),
`OTEL_RESOURCE_ATTRIBUTES`, `OTEL_TRACES_SAMPLER`/`_ARG` and `OTEL_EXPORTER_OTLP_*` (headers, timeout,
compression) act as the SDK documents them; `OTEL_BSP_MAX_QUEUE_SIZE`, `_MAX_EXPORT_BATCH_SIZE` and
`_SCHEDULE_DELAY` too, read here (the export queue is this module's). With no collector, `start`
returns None and nothing here runs for a request: the pipeline checks `tracing is None` once.

Never in the way: a request's spans are plain values on the event loop (`Trace`), handed at its end
to a bounded queue; one thread builds the SDK's finished spans from them and has the SDK's exporter
send them in batches. Spans that find the queue full, or whose export failed (collector down, slow
past its timeout, refusing), are dropped and counted in `traces_dropped_total`; no request waits.
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import SpanContext, SpanKind, Status, StatusCode, TraceFlags
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from opentelemetry.util.types import AttributeValue

from service.metrics import Metrics

if TYPE_CHECKING:
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import Event, ReadableSpan, SpanProcessor
    from opentelemetry.sdk.trace.export import SpanExporter
    from opentelemetry.sdk.trace.sampling import Sampler
    from opentelemetry.sdk.util.instrumentation import InstrumentationScope

log = logging.getLogger(__name__)

DEFAULT_SERVICE_NAME = "transformer-serve"
ENDPOINT_VARIABLES = ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")
FLUSH_S = 5.0  # at shutdown, after the models' drain: the longest the queued spans' export is waited for
MIN_FLUSH_S = 0.5  # ... even when the models' drain took all of SERVE_DRAIN_TIMEOUT_S
DEFAULT_QUEUE = 8192  # spans waiting for export (the SDK's default: 2048)
DEFAULT_DELAY_MS = 5000  # between exports when fewer than a batch wait (the SDK's default)
DEFAULT_BATCH = 2048  # spans per export (the SDK's: 512): an export's HTTP post costs 0.9 ms of CPU whatever its size
SAMPLED = TraceFlags(TraceFlags.SAMPLED)
UNSET = Status(StatusCode.UNSET)
PROPAGATOR = TraceContextTextMapPropagator()  # W3C traceparent and tracestate
Attributes = Mapping[str, AttributeValue]


def configured(environ: Mapping[str, str]) -> bool:
    """Whether the SDK's variables ask for traces: a collector endpoint, and the SDK not disabled."""
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    return any(environ.get(name, "").strip() for name in ENDPOINT_VARIABLES)


@dataclass
class Tracing:
    """The sampler, what takes a request's finished spans (`Trace`), and what shuts it down."""

    provider: trace.TracerProvider
    sampler: Sampler  # OTEL_TRACES_SAMPLER, _ARG
    record: Callable[[Trace], None]  # the export queue's: a request's spans, at its end
    finished: type[ReadableSpan]  # the SDK's classes (imported once tracing is on)
    event: Callable[[str, Attributes | None], Event]
    resource: Resource
    scope: InstrumentationScope
    roots_dropped: bool = False  # the sampler keeps no request without a sampled caller (`drops_roots`)
    roots_kept: bool = False  # ... or keeps every one (`keeps_roots`): such a request is traced unasked

    async def close(self, timeout_s: float) -> None:
        """Exports what is queued, waiting up to `timeout_s`: the export runs on a daemon thread
        that a slow collector may keep past it, never the process's exit."""
        from opentelemetry.sdk.trace import TracerProvider

        provider = self.provider
        if not isinstance(provider, TracerProvider):
            return
        loop = asyncio.get_running_loop()
        done = loop.create_future()

        def flush() -> None:
            try:
                provider.shutdown()  # exports what is queued, then stops the export thread
            finally:
                loop.call_soon_threadsafe(_settle, done)

        threading.Thread(target=flush, name="trace-flush", daemon=True).start()
        try:
            await asyncio.wait_for(done, timeout_s)
        except TimeoutError:
            log.warning("tracing: spans still unexported after %.1f s at shutdown", timeout_s)


def _settle(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


def start(metrics: Metrics, environ: Mapping[str, str] | None = None) -> Tracing | None:
    """Tracing as the SDK's variables configure it, or None when they name no collector."""
    environ = os.environ if environ is None else environ
    if not configured(environ):
        return None
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import Event, TracerProvider
    from opentelemetry.sdk.util.instrumentation import InstrumentationScope

    resource = Resource.create()  # OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES
    if str(resource.attributes.get("service.name", "")).startswith("unknown_service"):
        resource = resource.merge(Resource({"service.name": DEFAULT_SERVICE_NAME}))
    resource = _hashed(resource)
    # the sampler: OTEL_TRACES_SAMPLER, _ARG; shut down by the lifespan (`close`), not at exit
    provider = TracerProvider(resource=resource, shutdown_on_exit=False)
    bound = int(environ.get("OTEL_BSP_MAX_QUEUE_SIZE") or DEFAULT_QUEUE)
    batch = int(environ.get("OTEL_BSP_MAX_EXPORT_BATCH_SIZE") or min(DEFAULT_BATCH, bound))
    delay_s = float(environ.get("OTEL_BSP_SCHEDULE_DELAY") or DEFAULT_DELAY_MS) / 1000
    processor, put = _processor(_exporter(environ), metrics, bound, batch, delay_s)
    provider.add_span_processor(processor)
    protocol = _protocol(environ)
    log.info("tracing on: OTLP %s to %s", protocol, next(environ[n] for n in ENDPOINT_VARIABLES if environ.get(n)))
    scope = InstrumentationScope("service")
    sampler = provider.sampler
    return Tracing(
        provider,
        sampler,
        put,
        _finished(),
        Event,
        resource,
        scope,
        roots_dropped=drops_roots(sampler),
        roots_kept=keeps_roots(sampler),
    )


def _finished() -> type[ReadableSpan]:
    """The SDK's finished span, as the exporter reads it: nothing is ever dropped from these spans
    (their attributes, events and links are plain, unbounded), so the counts the encoder asks of
    every span are 0 without the SDK's three abstract-class checks."""
    from opentelemetry.sdk.trace import ReadableSpan

    class Finished(ReadableSpan):
        dropped_attributes = dropped_events = dropped_links = 0

    return Finished


def _hashed(resource: Resource) -> Resource:
    """The resource, its hash computed once: the exporter groups every span by its resource, and
    the SDK's `Resource.__hash__` serializes its attributes to JSON each time (a quarter of a
    child span's encoding)."""
    from opentelemetry.sdk.resources import Resource

    class Hashed(Resource):
        def __init__(self, attributes: Attributes, schema_url: str | None) -> None:
            super().__init__(attributes, schema_url)
            self._hash = super().__hash__()

        def __hash__(self) -> int:
            return self._hash

    return Hashed(resource.attributes, resource.schema_url)


def drops_roots(sampler: Sampler) -> bool:
    """Whether the sampler drops every request that carries no trace context (`always_off`,
    `traceidratio` 0, or those as a parent-based sampler's root): such a request then runs
    untraced without an id drawn or the sampler asked. Only the SDK's own samplers are read so,
    which decide by the trace id alone: the id 1, the likeliest kept under a ratio, dropped means
    every id is."""
    from opentelemetry.sdk.trace.sampling import Decision

    if type(sampler).__module__ != "opentelemetry.sdk.trace.sampling":
        return False
    return sampler.should_sample(None, 1, "probe").decision is Decision.DROP


def keeps_roots(sampler: Sampler) -> bool:
    """Whether the sampler keeps every request that carries no trace context (`always_on`,
    `traceidratio` 1.0, or those as a parent-based sampler's root, the default): such a request is
    then traced without the sampler asked. As `drops_roots`, only the SDK's own samplers, which
    decide by the trace id alone: the id least likely kept under a ratio, kept, means every id is."""
    from opentelemetry.sdk.trace.sampling import Decision

    if type(sampler).__module__ != "opentelemetry.sdk.trace.sampling":
        return False
    return sampler.should_sample(None, 2**128 - 1, "probe").decision is Decision.RECORD_AND_SAMPLE


def carries_context(headers: Sequence[tuple[bytes, bytes]]) -> bool:
    """The request names a caller's trace (a `traceparent` header)."""
    return any(key == b"traceparent" for key, _ in headers)


def _protocol(environ: Mapping[str, str]) -> str:
    name = environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or environ.get("OTEL_EXPORTER_OTLP_PROTOCOL")
    return (name or "http/protobuf").strip()


def _exporter(environ: Mapping[str, str]) -> SpanExporter:
    protocol = _protocol(environ)
    if protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcExporter

        return GrpcExporter()
    if protocol != "http/protobuf":
        raise ValueError(f"OTEL_EXPORTER_OTLP_PROTOCOL {protocol!r}: use http/protobuf or grpc")
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpExporter

    return HttpExporter()


def _processor(
    exporter: SpanExporter, metrics: Metrics, bound: int, batch: int, delay_s: float
) -> tuple[SpanProcessor, Callable[[Trace], None]]:
    """The export queue, and what hands it a request's spans, all at once (on the event loop);
    one thread exports them in batches of about `batch` spans, as soon as that many wait or every
    `delay_s`. Past `bound` waiting spans a request's are dropped, and counted
    (`traces_dropped_total`), as those the exporter could not deliver. (The SDK's classes are
    imported only here, once tracing is on.)"""
    from opentelemetry.sdk.trace import SpanProcessor
    from opentelemetry.sdk.trace.export import SpanExportResult

    dropped = metrics.traces_dropped

    class Batches(SpanProcessor):
        def __init__(self) -> None:
            self.traces: deque[Trace] = deque()
            self.added = 0  # spans put, written by the event loop only ...
            self.taken = 0  # ... spans taken, by the export thread only: no lock
            self.stopping = False
            self.wake = threading.Event()
            self.thread = threading.Thread(target=self._run, name="trace-export", daemon=True)
            self.thread.start()

        def put(self, trace: Trace) -> None:
            n = 1 + len(trace.children)
            if self.added - self.taken + n > bound:
                dropped.inc(n)
                return
            self.added += n
            self.traces.append(trace)
            if self.added - self.taken >= batch and not self.wake.is_set():
                self.wake.set()

        def _run(self) -> None:
            while not self.stopping:
                self.wake.wait(delay_s)
                self.wake.clear()
                self._export()
            self._export()  # what was put before the stop

        def _export(self) -> None:
            while self.traces:
                taken, n = [], 0
                while self.traces and n < batch:
                    taken.append(self.traces.popleft())
                    n += 1 + len(taken[-1].children)
                self.taken += n
                try:  # a span that cannot be built or sent is counted, and the thread goes on
                    result = exporter.export([span for t in taken for span in t.spans()])
                except Exception:
                    log.exception("trace export failed")
                    result = SpanExportResult.FAILURE
                if result is not SpanExportResult.SUCCESS:
                    dropped.inc(n)

        def shutdown(self) -> None:
            """Exports what waits, then stops (the provider's shutdown, `Tracing.close`)."""
            self.stopping = True
            self.wake.set()
            self.thread.join()
            exporter.shutdown()

        def force_flush(self, timeout_millis: int = 30000) -> bool:
            self.wake.set()  # an export now; not waited for (nothing here asks for one: `shutdown` does)
            return True

    queue = Batches()
    return queue, queue.put


def incoming(headers: Sequence[tuple[bytes, bytes]]) -> Context | None:
    """The caller's trace context (W3C `traceparent`, `tracestate`), if the request carries one."""
    carrier = {}
    for key, value in headers:
        if key in (b"traceparent", b"tracestate"):
            carrier[key.decode("latin-1")] = value.decode("latin-1")
    return PROPAGATOR.extract(carrier) if carrier else None


def server_span(
    tracing: Tracing, scope: Mapping[str, Any], method: str, route: str, request_id: str, start_ns: int
) -> Trace | None:
    """A request's SERVER span, named after its route (`POST /translate`), with the HTTP semantic
    conventions' attributes, continuing the caller's trace if the request carries one; None when
    the sampler leaves the request out."""
    name = f"{method} {route}"
    incoming_context = incoming(scope.get("headers", ()))
    parent = trace.get_current_span(incoming_context).get_span_context() if incoming_context else None
    if parent is not None and not parent.is_valid:
        parent = None
    trace_id = parent.trace_id if parent is not None else random.getrandbits(128)
    trace_state = None
    if incoming_context is not None or not tracing.roots_kept:
        sampled = tracing.sampler.should_sample(incoming_context, trace_id, name, SpanKind.SERVER)
        if not sampled.decision.is_sampled():
            return None
        trace_state = sampled.trace_state
    attributes: dict[str, AttributeValue] = {
        "http.request.method": method,
        "http.route": route,
        "url.path": str(scope.get("path", "")),
        "url.scheme": str(scope.get("scheme", "http")),
        "transformer_serve.request_id": request_id,
    }
    # the conventions' required ones and client.address; not client.port (opt-in), nor server.address,
    # server.port and network.protocol.version (the resource names the instance; always HTTP/1.1): each
    # attribute costs the export thread ~1.7 us of CPU (docs/deployment.md#tracing)
    client = scope.get("client")
    if client:
        attributes["client.address"] = client[0]
    context = SpanContext(trace_id, _span_id(), False, SAMPLED, trace_state)
    return Trace(tracing, name, context, parent, start_ns, attributes)


def _span_id() -> int:
    return random.getrandbits(64) or 1


class Trace:
    """One request's SERVER span, to which its parts add children (with their own start and end
    times, measured where the work ran) and events.

    The event loop keeps the spans as plain values (attributes in a dict as they come, a child a
    tuple) and hands the request's to the export queue once, at its end; the export thread builds
    the SDK's finished spans (`ReadableSpan`) from them. The sampler is asked once, at the start. The
    SDK's own spans (start, attribute checks on every set, end), or finished spans built and queued
    one by one, cost the event loop several times as much (docs/deployment.md#tracing)."""

    def __init__(
        self,
        tracing: Tracing,
        name: str,
        context: SpanContext,
        parent: SpanContext | None,
        start_ns: int,
        attributes: dict[str, AttributeValue],
    ) -> None:
        self.tracing, self.name, self.context, self.parent = tracing, name, context, parent
        self.start_ns, self.attributes = start_ns, attributes
        self.events: list[Event] = []
        self.children: list[tuple[str, int, int, Attributes | None]] = []  # name, start, end, attributes
        self.end_ns = 0
        self.error: str | None = None
        self.streamed = False  # the answer is a stream that runs the work: the span ends once it is sent

    @property
    def trace_id(self) -> str:
        """32 hex digits, as exemplars and trace viewers show it."""
        return format(self.context.trace_id, "032x")

    def child(self, name: str, start_ns: int, end_ns: int, attributes: Attributes | None = None) -> None:
        """A finished child span of the request's span."""
        self.children.append((name, start_ns, end_ns, attributes))

    def set(self, attributes: Attributes) -> None:
        self.attributes.update(attributes)

    def event(self, name: str, attributes: Attributes | None = None) -> None:
        self.events.append(self.tracing.event(name, attributes))

    def fail(self, description: str) -> None:
        """The request failed on the server's side (a 5xx): the span's status is an error."""
        self.error = description

    def end(self) -> None:
        """Hands the request's spans to the export queue, its own ending now; nothing changes it after."""
        self.end_ns = time.time_ns()
        self.tracing.record(self)

    def spans(self) -> list[ReadableSpan]:
        """The request's span and its children as the SDK's finished spans: built by the export
        thread, in batches, not on the event loop."""
        t, context = self.tracing, self.context
        status = Status(StatusCode.ERROR, self.error) if self.error is not None else UNSET
        out = [
            t.finished(
                self.name,
                status=status,
                context=context,
                parent=self.parent,
                resource=t.resource,
                attributes=self.attributes,
                events=self.events,
                kind=SpanKind.SERVER,
                start_time=self.start_ns,
                end_time=self.end_ns,
                instrumentation_scope=t.scope,
            )
        ]
        for name, start_ns, end_ns, attributes in self.children:
            out.append(
                t.finished(
                    name,
                    status=UNSET,
                    context=SpanContext(context.trace_id, _span_id(), False, SAMPLED, context.trace_state),
                    parent=context,
                    resource=t.resource,
                    attributes=attributes,
                    kind=SpanKind.INTERNAL,
                    start_time=start_ns,
                    end_time=end_ns,
                    instrumentation_scope=t.scope,
                )
            )
        return out
