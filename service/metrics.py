"""Every Prometheus object of the service, defined once. The names are a contract for dashboards.

Each app gets its own `CollectorRegistry`, so tests can build several apps in one process.
"""

from __future__ import annotations

from collections.abc import Sequence

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.openmetrics import exposition as openmetrics

CONTENT_TYPE = CONTENT_TYPE_LATEST

# Millisecond latencies up to the request timeout.
LATENCY_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0)
BATCH_SIZE_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)


class Metrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry(auto_describe=True)
        r = self.registry
        self.requests = Counter(
            "inference_requests", "Inference requests answered", ["endpoint", "model", "status"], registry=r
        )
        self.request_duration = Histogram(
            "inference_request_duration_seconds",
            "Inference request latency, from its arrival (before the body is read) to the response",
            ["endpoint", "model"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.queue_wait = Histogram(
            "inference_queue_wait_seconds",
            "Time an item waited in the batcher before its batch ran",
            ["model"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.batch_size = Histogram(
            "inference_batch_size",
            "Items per executed batch (translation: sentences admitted together into the running batch)",
            ["model"],
            buckets=BATCH_SIZE_BUCKETS,
            registry=r,
        )
        self.compute = Histogram(
            "inference_compute_seconds",
            "Model compute time per run (stage: classify per batch; encode per admission; decode per decoder step)",
            ["model", "stage"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.queue_depth = Gauge("inference_queue_depth", "Items queued, not yet running", ["model"], registry=r)
        self.generated_tokens = Counter(
            "inference_generated_tokens",
            "Tokens generated (returned best hypotheses, EOS included)",
            ["model"],
            registry=r,
        )
        self.active_sequences = Gauge(
            "inference_active_sequences", "Sentences in the running decoder batch", ["model"], registry=r
        )
        self.active_rows = Gauge(
            "inference_active_rows", "Decoder rows (sentences x beams) in the running batch", ["model"], registry=r
        )
        self.auth_refusals = Counter(
            "inference_auth_refusals",
            "Requests refused by the key check (reason: missing_key, invalid_key, role, model_control_off, "
            "no_admin_keys)",
            ["reason"],
            registry=r,
        )
        self.model_loads = Counter(
            "inference_model_loads",
            "Model versions put into service (result=loaded) or refused (broken files, failed load)",
            ["model", "result"],
            registry=r,
        )
        self.cancelled = Counter(
            "inference_cancelled_sentences",
            "Sentences that left before finishing (reason: disconnect, deadline, shutdown, error)",
            ["model", "reason"],
            registry=r,
        )
        self.traces_dropped = Counter(
            "traces_dropped",
            "Trace spans not delivered: the export queue was full, or the collector failed or timed out",
            registry=r,
        )
        self.client_limited = Counter(
            "inference_client_limited",
            "Requests refused by a per-client limit (limit: requests, chars, request_chars); never labelled by client",
            ["limit"],
            registry=r,
        )
        for limit in ("requests", "chars", "request_chars"):
            self.client_limited.labels(limit)
        self.first_event = Histogram(
            "inference_stream_first_event_seconds",
            "Streamed answers: from the request's arrival to its first event",
            ["endpoint"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.streams = Gauge("inference_streams_in_flight", "Streamed answers being sent", ["endpoint"], registry=r)
        self.streams_cut = Counter(
            "inference_streams_cut",
            "Streamed answers cancelled because their reader fell a whole buffer behind (stream_buffer_events)",
            ["endpoint"],
            registry=r,
        )
        self._answered: dict[tuple[str, str, int], tuple[Counter, Histogram]] = {}

    def answered(self, endpoint: str, model: str, status: int, seconds: float, trace_id: str = "") -> None:
        """Counts a request and observes its latency, with its trace id as the exemplar when it was
        traced. The labelled children are kept: looking them up costs more than updating them
        (labels() converts and locks every time), once a request."""
        key = (endpoint, model, status)
        children = self._answered.get(key)
        if children is None:
            children = self.requests.labels(endpoint, model, str(status)), self.request_duration.labels(endpoint, model)
            self._answered[key] = children
        children[0].inc()
        if trace_id:
            children[1].observe(seconds, {"trace_id": trace_id})
        else:
            children[1].observe(seconds)

    def render(self) -> bytes:
        return generate_latest(self.registry)

    def exposition(self, accept: str) -> tuple[bytes, str]:
        """The exposition and its content type: OpenMetrics (with the latency exemplars: trace ids)
        when the scraper accepts it, else Prometheus text."""
        if "application/openmetrics-text" in accept:
            return openmetrics.generate_latest(self.registry), openmetrics.CONTENT_TYPE_LATEST
        return generate_latest(self.registry), CONTENT_TYPE

    def observer(self, model: str) -> BatchMetrics:
        return BatchMetrics(self, model)


class BatchMetrics:
    """One model's queue and compute metrics (a `BatchObserver` and a `StepObserver`)."""

    def __init__(self, metrics: Metrics, model: str) -> None:
        self._depth = metrics.queue_depth.labels(model=model)
        self._wait = metrics.queue_wait.labels(model=model)
        self._size = metrics.batch_size.labels(model=model)
        self._compute = metrics.compute
        self._tokens = metrics.generated_tokens.labels(model=model)
        self._active_sequences = metrics.active_sequences.labels(model=model)
        self._active_rows = metrics.active_rows.labels(model=model)
        self._cancelled = metrics.cancelled
        self.model = model
        self._depth.set(0)

    def queue_depth(self, depth: int) -> None:
        self._depth.set(depth)

    def batch_started(self, size: int, queue_waits: Sequence[float]) -> None:
        self._size.observe(size)
        for w in queue_waits:
            self._wait.observe(w)

    def compute_time(self, stage: str, seconds: float) -> None:
        self._compute.labels(model=self.model, stage=stage).observe(seconds)

    def generated(self, tokens: int) -> None:
        self._tokens.inc(tokens)

    def active(self, sentences: int, rows: int) -> None:
        self._active_sequences.set(sentences)
        self._active_rows.set(rows)

    def cancelled(self, reason: str, sentences: int) -> None:
        self._cancelled.labels(model=self.model, reason=reason).inc(sentences)
