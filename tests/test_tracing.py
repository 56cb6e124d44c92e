"""OpenTelemetry traces: a real server exporting OTLP to a real receiver run here, which decodes
the payload with the OpenTelemetry protobuf definitions; the span tree and attributes of each kind
of request; a collector down or refusing never fails a request, and its lost spans are counted."""

from __future__ import annotations

import gzip
import secrets
import threading
from collections.abc import Iterator
from concurrent import futures
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
from google.protobuf.message import Message
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2
from opentelemetry.proto.common.v1.common_pb2 import AnyValue

from bench.serverproc import free_port
from service.metrics import Metrics
from service.scheduling.policy import Job, Mark, Sentence
from service.tasks.seq2seq import trace_job
from service.tracing import carries_context, configured, drops_roots, keeps_roots, start
from tests.helpers import metric, run_server, until


@dataclass
class Span:
    name: str
    trace_id: str
    span_id: str
    parent: str
    kind: int
    attributes: dict[str, Any]
    events: list[str]
    service: str
    start_ns: int
    end_ns: int


def _value(v: AnyValue) -> Any:
    which = v.WhichOneof("value")
    if which == "array_value":
        return [_value(x) for x in v.array_value.values]
    return getattr(v, which) if which else None


def _spans(request: trace_service_pb2.ExportTraceServiceRequest) -> list[Span]:
    out = []
    for rs in request.resource_spans:
        resource = {a.key: _value(a.value) for a in rs.resource.attributes}
        for ss in rs.scope_spans:
            for s in ss.spans:
                out.append(
                    Span(
                        s.name,
                        s.trace_id.hex(),
                        s.span_id.hex(),
                        s.parent_span_id.hex(),
                        s.kind,
                        {a.key: _value(a.value) for a in s.attributes},
                        [e.name for e in s.events],
                        str(resource.get("service.name")),
                        s.start_time_unix_nano,
                        s.end_time_unix_nano,
                    )
                )
    return out


@dataclass
class Receiver:
    """What a collector received; `status` is what it answers (503: refusing)."""

    spans: list[Span] = field(default_factory=list)
    status: int = 200
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, payload: bytes) -> None:
        request = trace_service_pb2.ExportTraceServiceRequest()
        request.ParseFromString(payload)
        with self.lock:
            self.spans.extend(_spans(request))

    def trace(self, trace_id: str) -> list[Span]:
        with self.lock:
            return [s for s in self.spans if s.trace_id == trace_id]


@contextmanager
def http_receiver() -> Iterator[tuple[Receiver, str]]:
    """An OTLP/HTTP receiver on loopback: `POST /v1/traces`, protobuf body."""
    received = Receiver()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 (http.server's name)
            body = self.rfile.read(int(self.headers.get("content-length", 0)))
            if self.headers.get("content-encoding") == "gzip":
                body = gzip.decompress(body)
            if self.path == "/v1/traces" and received.status == 200:
                received.add(body)
            answer: Message = trace_service_pb2.ExportTraceServiceResponse()
            data = answer.SerializeToString()
            self.send_response(received.status if self.path == "/v1/traces" else 404)
            self.send_header("content-type", "application/x-protobuf")
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield received, f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@contextmanager
def grpc_receiver() -> Iterator[tuple[Receiver, str]]:
    """An OTLP/gRPC receiver on loopback: the proto's TraceService."""
    import grpc
    from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc

    received = Receiver()

    class Service(trace_service_pb2_grpc.TraceServiceServicer):
        def Export(self, request: Any, context: Any) -> Any:  # noqa: N802 (the proto's name)
            received.add(request.SerializeToString())
            return trace_service_pb2.ExportTraceServiceResponse()

    server = grpc.server(futures.ThreadPoolExecutor(2))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(Service(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield received, f"http://127.0.0.1:{port}"
    finally:
        server.stop(None)


def otel_env(endpoint: str, protocol: str = "http/protobuf", **extra: str) -> dict[str, str]:
    return {
        "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint,
        "OTEL_EXPORTER_OTLP_PROTOCOL": protocol,
        "OTEL_BSP_SCHEDULE_DELAY": "50",  # ms: the test waits less for a batch
        "OTEL_RESOURCE_ATTRIBUTES": "deployment.environment=test",
        **extra,
    }


def traceparent() -> tuple[str, str, str]:
    trace_id, parent = secrets.token_hex(16), secrets.token_hex(8)
    return trace_id, parent, f"00-{trace_id}-{parent}-01"


def traced(c: httpx.Client, received: Receiver, path: str, **kwargs: Any) -> tuple[Span, list[Span]]:
    """The request's SERVER span, continuing the caller's trace, and its children."""
    trace_id, parent, header = traceparent()
    r = c.post(path, headers={"traceparent": header, "tracestate": "vendor=1"}, **kwargs)
    assert r.status_code == 200, r.text
    until(f"the spans of {path}", lambda: any(s.kind == 2 for s in received.trace(trace_id)), 30)
    spans = received.trace(trace_id)
    (server,) = [s for s in spans if s.kind == 2]  # SPAN_KIND_SERVER
    assert server.parent == parent and server.service == "transformer-serve"
    assert server.attributes["http.request.method"] == "POST" and server.attributes["http.response.status_code"] == 200
    assert server.attributes["url.path"] == path
    children = [s for s in spans if s.parent == server.span_id]
    for child in children:
        assert server.start_ns <= child.start_ns <= child.end_ns <= server.end_ns, child
    return server, children


def check_translation(server: Span, children: list[Span], model: str = "tiny-mt") -> dict[str, Span]:
    named = {s.name: s for s in children}
    assert set(named) == {"tokenize", "queue", "encoder", "decode", "assembly"}, named
    a = server.attributes
    assert a["transformer_serve.model"] == model and a["transformer_serve.model_version"] == 1
    assert a["gen_ai.usage.input_tokens"] > 0 and a["gen_ai.usage.output_tokens"] > 0
    assert set(a["gen_ai.response.finish_reasons"]) <= {"eos", "length"} and a["gen_ai.response.finish_reasons"]
    decode = named["decode"].attributes
    assert decode["transformer_serve.steps"] >= 1 and decode["transformer_serve.rows_at_join"] >= 1
    assert decode["transformer_serve.sentences"] == decode["transformer_serve.sentences_finished"] >= 1
    assert named["queue"].end_ns <= named["encoder"].end_ns <= named["decode"].start_ns
    assert named["decode"].end_ns <= named["assembly"].start_ns
    return named


def test_tracing_is_off_without_a_collector() -> None:
    assert not configured({})
    assert not configured({"OTEL_EXPORTER_OTLP_ENDPOINT": " "})
    assert configured({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://collector:4318/v1/traces"})
    assert not configured({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_SDK_DISABLED": "true"})
    assert start(Metrics(), {}) is None
    with pytest.raises(ValueError, match="http/protobuf or grpc"):
        start(Metrics(), {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"})


def test_a_sampler_that_keeps_no_root_or_every_root_is_told_without_asking_it_per_request() -> None:
    """`drops_roots`: a request without a caller's context then runs untraced at once; a parent-based
    sampler still follows a sampled caller (such a request is asked as before: `carries_context`)."""
    from opentelemetry.sdk.trace import sampling

    dropping = [sampling.ALWAYS_OFF, sampling.TraceIdRatioBased(0), sampling.ParentBased(sampling.TraceIdRatioBased(0))]
    keeping = [sampling.ALWAYS_ON, sampling.TraceIdRatioBased(1e-9), sampling.ParentBased(sampling.ALWAYS_ON)]

    class Custom(sampling.Sampler):  # not the SDK's: never assumed to decide by the id alone
        def should_sample(self, *args: Any, **kwargs: Any) -> sampling.SamplingResult:
            return sampling.SamplingResult(sampling.Decision.DROP)

        def get_description(self) -> str:
            return "custom"

    assert [drops_roots(s) for s in dropping] == [True] * 3
    assert [drops_roots(s) for s in [*keeping, Custom()]] == [False] * 4
    # `keeps_roots`: such a request is traced without the sampler asked; not under a ratio below 1
    every = [sampling.ALWAYS_ON, sampling.TraceIdRatioBased(1.0), sampling.ParentBased(sampling.ALWAYS_ON)]
    assert [keeps_roots(s) for s in every] == [True] * 3
    some = [sampling.TraceIdRatioBased(1 - 1e-9), sampling.ParentBased(sampling.TraceIdRatioBased(0.5))]
    assert [keeps_roots(s) for s in [*some, *dropping, Custom()]] == [False] * 6
    assert carries_context([(b"traceparent", b"00-" + b"1" * 32 + b"-" + b"2" * 16 + b"-01")])
    assert not carries_context([(b"tracestate", b"a=b"), (b"x-traceparent", b"1")])


class Children:
    """Records what `trace_job` adds to a request's span."""

    def __init__(self) -> None:
        self.spans: list[tuple[str, int, int, dict[str, Any]]] = []

    def child(self, name: str, start_ns: int, end_ns: int, attributes: dict[str, Any] | None = None) -> None:
        self.spans.append((name, start_ns, end_ns, dict(attributes or {})))


def test_a_jobs_spans_come_from_the_marks_its_sentences_left() -> None:
    """Two sentences encoded in one run; one finished, the other cut (the deadline): the decode span
    runs from the first join to the request's end, its steps those of the finished one."""
    job = Job(deadline=0.0, enqueued=0.0)
    done = Sentence(job, 0, [5, 2], None, 4, 8, encoder=(100, 110), joined=Mark(120, 3, 5), left=Mark(200, 4, 9))  # type: ignore[arg-type]
    cut = Sentence(job, 1, [6, 2], None, 4, 8, encoder=(100, 110), joined=Mark(130, 4, 6))  # type: ignore[arg-type]
    job.sentences = [done, cut]
    children = Children()
    trace_job(children, job, 90, 250, express=False)  # type: ignore[arg-type]
    ts = "transformer_serve."
    assert children.spans == [
        ("queue", 90, 100, {ts + "sentences": 2}),
        ("encoder", 100, 110, {ts + "encoder_runs": 1}),
        (
            "decode",
            120,
            250,
            {
                ts + "sentences": 2,
                ts + "sentences_finished": 1,
                ts + "steps": 4,
                ts + "rows_at_join": 3,
                ts + "rows_at_leave": 4,
                ts + "lane": "main",
            },
        ),
    ]
    cut.left = Mark(220, 2, 10)  # both finished: the decode span ends as the last leaves
    children = Children()
    trace_job(children, job, 90, 250, express=True)  # type: ignore[arg-type]
    name, start, end, decode = children.spans[-1]
    assert (name, start, end, decode[ts + "steps"], decode[ts + "rows_at_leave"]) == ("decode", 120, 220, 5, 2)
    assert decode[ts + "lane"] == "express"
    waiting = Job(deadline=0.0, enqueued=0.0)  # never joined: the queue span alone, to the request's end
    waiting.sentences = [Sentence(waiting, 0, [5, 2], None, 4, 8)]  # type: ignore[arg-type]
    children = Children()
    trace_job(children, waiting, 90, 250, express=False)  # type: ignore[arg-type]
    assert children.spans == [("queue", 90, 250, {ts + "sentences": 1})]


@pytest.mark.slow
def test_spans_of_every_kind_of_request_reach_the_collector(tiny_store: Path, tmp_path: Path) -> None:
    with (
        http_receiver() as (received, endpoint),
        run_server(tiny_store, tmp_path / "server.log", env=otel_env(endpoint)) as server,
        httpx.Client(base_url=server.url, timeout=30) as c,
    ):
        beam = {"texts": ["A dog runs.", "The red cat sleeps."], "decode": "beam", "beam_size": 2}
        span, children = traced(c, received, "/translate", json=beam)
        assert span.name == "POST /translate" and span.attributes["http.route"] == "/translate"
        assert span.attributes["transformer_serve.texts"] == 2
        assert span.attributes["transformer_serve.task"] == "translation"
        assert check_translation(span, children)["decode"].attributes["transformer_serve.lane"] == "main"
        span, children = traced(c, received, "/translate", json={"texts": ["A dog runs."], "decode": "greedy"})
        assert check_translation(span, children)["decode"].attributes["transformer_serve.lane"] == "express"

        span, children = traced(c, received, "/predict", json={"texts": ["The red cat.", "A dog."]})
        assert span.name == "POST /predict" and span.attributes["transformer_serve.model"] == "tiny-clf"
        assert {s.name for s in children} == {"queue", "batch"}  # tokenizing: the time before the queue
        batches = [s.attributes for s in children if s.name == "batch"]  # one request at a time: only its texts
        assert sum(b["transformer_serve.batch_size"] for b in batches) == 2
        for b in batches:  # every text padded to the batch's longest
            assert b["transformer_serve.padded_tokens"] % b["transformer_serve.batch_size"] == 0
        padded = sum(b["transformer_serve.padded_tokens"] for b in batches)
        assert padded >= span.attributes["gen_ai.usage.input_tokens"]

        oip = {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1], "data": ["A dog runs."]}]}
        span, children = traced(c, received, "/v2/models/tiny-mt/infer", json=oip)
        assert span.name == "POST /v2/models/{name}/infer"
        assert span.attributes["http.route"] == "/v2/models/{name}/infer"
        check_translation(span, children)

        # completions run the work in their answer, or as a stream (as a streamed /translate): the same
        # children, the stream's span ending once it is sent
        completion = {"model": "tiny-mt", "prompt": "A dog runs.", "temperature": 0}
        for path, body in (
            ("/v1/completions", completion),
            ("/v1/completions", completion | {"stream": True}),
            ("/translate", {"texts": ["A dog runs."], "stream": True}),
        ):
            span, children = traced(c, received, path, json=body)
            assert span.name == f"POST {path}" and span.attributes["transformer_serve.texts"] == 1
            check_translation(span, children)

        text = b"A dog runs.\nThe red cat sleeps.\nA dog runs.\n"
        upload = {"files": {"file": ("a.txt", text)}, "data": {"model": "tiny-mt"}}
        span, children = traced(c, received, "/translate_file", **upload)
        (document,) = children
        assert document.name == "document" and span.name == "POST /translate_file"
        assert document.attributes["transformer_serve.document.segments"] >= 2
        assert document.attributes["transformer_serve.document.distinct_segments"] == 2

        # a request without a traceparent starts its own trace; an error is an event on its span
        before = {s.trace_id for s in received.spans}
        r = c.post("/translate", json={"texts": ["A dog runs."], "max_new_tokens": 10_000})
        assert r.status_code == 422
        r = c.post("/translate", json={"texts": ["A dog runs. The red cat sleeps."] * 8, "timeout_ms": 1})
        assert r.status_code == 504

        def errors() -> dict[str, Span]:
            return {s.events[0]: s for s in received.spans if s.kind == 2 and s.trace_id not in before and s.events}

        until("the failed requests' spans", lambda: set(errors()) == {"error", "deadline"}, 30)
        assert errors()["error"].attributes["http.response.status_code"] == 422
        assert errors()["deadline"].attributes["http.response.status_code"] == 504
        assert errors()["deadline"].attributes["error.type"] == "DeadlineExceeded"

        # the latency histogram carries trace ids as OpenMetrics exemplars
        exposition = c.get("/metrics", headers={"accept": "application/openmetrics-text; version=1.0.0"})
        assert exposition.headers["content-type"].startswith("application/openmetrics-text")
        ids = {s.trace_id for s in received.spans}
        exemplars = [line for line in exposition.text.splitlines() if 'trace_id="' in line]
        assert exemplars and all(line.split('trace_id="')[1][:32] in ids for line in exemplars)
        assert "trace_id" not in c.get("/metrics").text  # Prometheus text: no exemplars
        assert metric(c.get("/metrics").text, "traces_dropped_total") == 0


@pytest.mark.slow
def test_spans_over_grpc_and_flushed_at_shutdown(tiny_store: Path, tmp_path: Path) -> None:
    """Over OTLP/gRPC; the spans wait in the queue (a batch every 10 min) until shutdown exports them."""
    trace_id, parent, header = traceparent()
    with grpc_receiver() as (received, endpoint):
        env = otel_env(endpoint, "grpc", OTEL_BSP_SCHEDULE_DELAY="600000")
        with (
            run_server(tiny_store, tmp_path / "server.log", env=env) as server,
            httpx.Client(base_url=server.url, timeout=30) as c,
        ):
            r = c.post("/translate", json={"texts": ["A dog runs."]}, headers={"traceparent": header})
            assert r.status_code == 200
            assert not received.trace(trace_id)  # not exported yet
        spans = received.trace(trace_id)  # the server has exited: it flushed them
    (span,) = [s for s in spans if s.kind == 2]
    assert span.parent == parent and span.name == "POST /translate"
    check_translation(span, [s for s in spans if s.parent == span.span_id])


@pytest.mark.slow
@pytest.mark.parametrize("collector", ["down", "refusing"])
def test_a_collector_down_or_refusing_fails_no_request(collector: str, tiny_store: Path, tmp_path: Path) -> None:
    with http_receiver() as (received, endpoint):
        received.status = 503
        if collector == "down":
            endpoint = f"http://127.0.0.1:{free_port()}"  # nothing listens there
        bounds = {"OTEL_BSP_MAX_QUEUE_SIZE": "8", "OTEL_BSP_MAX_EXPORT_BATCH_SIZE": "4"}
        env = otel_env(endpoint, OTEL_EXPORTER_OTLP_TIMEOUT="1", **bounds)
        with (
            run_server(tiny_store, tmp_path / "server.log", env=env) as server,
            httpx.Client(base_url=server.url, timeout=30) as c,
        ):
            for i in range(20):
                assert c.post("/predict", json={"texts": [f"The red cat {i}."]}).status_code == 200
                assert c.post("/translate", json={"texts": ["A dog runs."], "decode": "greedy"}).status_code == 200
            until("lost spans counted", lambda: metric(c.get("/metrics").text, "traces_dropped_total") >= 8, 30)
    assert not received.spans


@pytest.mark.slow
def test_sampled_out_requests_are_not_traced(tiny_store: Path, tmp_path: Path) -> None:
    """Tracing configured, the sampler taking none: no span, no exemplar, the answers the same."""
    with http_receiver() as (received, endpoint):
        env = otel_env(endpoint, OTEL_TRACES_SAMPLER="traceidratio", OTEL_TRACES_SAMPLER_ARG="0")
        with (
            run_server(tiny_store, tmp_path / "server.log", env=env) as server,
            httpx.Client(base_url=server.url, timeout=30) as c,
        ):
            for path, body in (("/predict", {"texts": ["The red cat."]}), ("/translate", {"texts": ["A dog runs."]})):
                assert c.post(path, json=body).status_code == 200
            exposition = c.get("/metrics", headers={"accept": "application/openmetrics-text"}).text
            assert metric(exposition, "inference_request_duration_seconds_count") == 2
            assert "trace_id" not in exposition
    assert not received.spans
