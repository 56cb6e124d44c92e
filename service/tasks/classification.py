"""Text classification: `POST /predict`, OIP outputs `label` and `probabilities`."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
from pydantic import Field

from service.engine.classifier import ClassifierEngine, load_classifier
from service.engine.runtime import LoadOptions
from service.metrics import BatchMetrics
from service.priority import lower_priority
from service.scheduling.batcher import BatchLimits, DynamicBatcher, Ran
from service.store import StoreEntry
from service.tasks.base import (
    AttentionRequest,
    ModelName,
    OutputTensor,
    ResponseModel,
    StrictModel,
    Task,
    TaskContext,
    TensorSpec,
    Work,
)
from service.tracing import Trace


class ClassifyOptions(StrictModel):
    """Classification has no per-request options: every protocol decodes into this empty set."""


class PredictRequest(AttentionRequest, ClassifyOptions):
    texts: list[str] = Field(min_length=1, description="texts to classify")
    model: ModelName | None = Field(default=None, description="model name; default: the only (or default) classifier")
    return_attention: bool = Field(default=False, description="the last layer's self-attention (one text per request)")


class SelfAttention(ResponseModel):
    tokens: list[str]
    weights: list[list[list[float]]] = Field(description="[head][query][key]; rows sum to 1")


class Prediction(ResponseModel):
    label: str
    score: float
    scores: dict[str, float]
    attention: SelfAttention | None = None


class PredictResponse(ResponseModel):
    model: str
    version: int
    predictions: list[Prediction]


@dataclass(frozen=True)
class Classified:
    """A classification's result: per text its class probabilities (the labels' order)."""

    probs: list[list[float]]
    attention: SelfAttention | None = None


class ClassificationTask(Task[PredictRequest, Classified]):
    name = "classification"
    rest_path = "/predict"
    summary = "Classify texts: the label, its probability and every class's"
    default_setting = "default_classifier"
    threads_setting = "classification_threads"
    cpu_share = 0.25
    Options = ClassifyOptions
    Request = PredictRequest
    Response = PredictResponse

    def __init__(self, entry: StoreEntry, engine: ClassifierEngine, context: TaskContext) -> None:
        super().__init__(entry, engine.variant)
        self.engine = engine
        s = context.settings
        limits = BatchLimits(s.max_batch_size, s.max_wait_ms / 1000, s.max_queue, s.max_batch_tokens)
        self.executor = ThreadPoolExecutor(1, f"classify-{entry.name}", lower_priority)
        self.batcher: DynamicBatcher[list[int], list[float]] = DynamicBatcher(
            entry.name,
            _runner(engine, context.metrics),
            limits,
            size=len,
            executor=self.executor,
            observer=context.metrics,
        )

    @classmethod
    def load(cls, entry: StoreEntry, options: LoadOptions, context: TaskContext) -> ClassificationTask:
        engine = load_classifier(entry, options)
        engine.warmup()
        return cls(entry, engine, context)

    def start(self) -> None:
        self.batcher.start()

    async def close(self, timeout: float) -> None:
        await self.batcher.close(timeout)
        self.executor.shutdown(wait=False, cancel_futures=True)

    @property
    def in_flight(self) -> int:
        return self.batcher.in_flight

    def describe(self) -> Mapping[str, object]:
        return {"labels": list(self.engine.labels), "max_source_tokens": self.manifest.max_source_tokens}

    def outputs(self) -> list[TensorSpec]:
        return [TensorSpec("label", "BYTES", [-1]), TensorSpec("probabilities", "FP32", [-1, len(self.engine.labels)])]

    async def run(self, work: Work) -> Classified:
        # the probabilities come as Python floats: made once per batch in the worker thread, not
        # per request on the event loop
        probs = await self.batcher.submit_many(self.engine.encode(work.texts), work.deadline)
        return await self._answer(work, probs)

    async def run_traced(self, work: Work, trace: Trace) -> Classified:
        """`run`, with its parts as children of the request's span: tokenize, queue (to its first
        batch), each batch it ran in (items, padded tokens)."""
        t0 = time.time_ns()
        ids = self.engine.encode(work.texts)
        t1 = time.time_ns()
        tokens = sum(len(x) for x in ids)
        trace.child("tokenize", t0, t1, {"gen_ai.usage.input_tokens": tokens})
        trace.set({"transformer_serve.texts": len(work.texts), "gen_ai.usage.input_tokens": tokens})
        ran: list[Ran] = []
        probs = await self.batcher.submit_many(ids, work.deadline, ran)
        batches = sorted(set(ran), key=lambda b: b.start_ns)
        trace.child(
            "queue", t1, batches[0].start_ns if batches else time.time_ns(), {"transformer_serve.texts": len(ids)}
        )
        for b in batches:
            trace.child(
                "batch",
                b.start_ns,
                b.end_ns,
                {"transformer_serve.batch_size": b.items, "transformer_serve.padded_tokens": b.padded},
            )
        return await self._answer(work, probs)

    async def _answer(self, work: Work, probs: list[list[float]]) -> Classified:
        attention = None
        if work.attention:
            loop = asyncio.get_running_loop()
            tokens, weights = await loop.run_in_executor(self.executor, self.engine.attention, work.texts[0])
            attention = SelfAttention(tokens=tokens, weights=weights.tolist())
        return Classified(probs, attention)

    def tensors(self, result: Classified) -> list[OutputTensor]:
        probs = np.asarray(result.probs)  # (N, C)
        n, c = probs.shape
        labels = [self.engine.labels[i] for i in probs.argmax(axis=1)]
        return [
            OutputTensor("label", "BYTES", [n], labels),
            OutputTensor("probabilities", "FP32", [n, c], probs.astype(np.float32).reshape(-1).tolist()),
        ]

    def rest_answer(self, body: PredictRequest, result: Classified) -> PredictResponse:
        # built from the engine's own values, so not validated again (a few microseconds a text)
        return PredictResponse.model_construct(
            model=self.entry.name,
            version=self.entry.version,
            predictions=[
                Prediction.model_construct(label=p.label, score=p.score, scores=p.scores, attention=result.attention)
                for p in self.engine.to_predictions(result.probs)
            ],
        )


def _runner(engine: ClassifierEngine, obs: BatchMetrics) -> Callable[[list[list[int]]], list[list[float]]]:
    def run(seqs: list[list[int]]) -> list[list[float]]:
        t0 = time.perf_counter()
        probs = engine.classify_ids(seqs)  # (B, C)
        obs.compute_time("classify", time.perf_counter() - t0)
        rows: list[list[float]] = probs.tolist()
        return rows

    return run
