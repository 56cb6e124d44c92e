"""Text classification: `POST /predict`, OIP outputs `label` and `probabilities`."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
from pydantic import Field, model_validator

from service.engine.classifier import ClassifierEngine, load_classifier
from service.engine.runtime import LoadOptions
from service.metrics import BatchMetrics
from service.priority import lower_priority
from service.scheduling.batcher import BatchLimits, DynamicBatcher
from service.store import StoreEntry
from service.tasks.base import (
    ONE_TEXT_FOR_ATTENTION,
    ModelName,
    OutputTensor,
    ResponseModel,
    Task,
    TaskContext,
    TensorSpec,
    TextsRequest,
)


class PredictRequest(TextsRequest):
    model_config = TextsRequest.model_config | {"json_schema_extra": {"allOf": [ONE_TEXT_FOR_ATTENTION]}}

    texts: list[str] = Field(min_length=1, description="texts to classify")
    model: ModelName | None = Field(default=None, description="model name; default: the only (or default) classifier")
    return_attention: bool = Field(default=False, description="the last layer's self-attention (one text per request)")

    @model_validator(mode="after")
    def _one_text_for_attention(self) -> PredictRequest:
        if self.return_attention and len(self.texts) != 1:
            raise ValueError("return_attention takes one text per request")
        return self


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


class ClassificationTask(Task):
    name = "classification"
    rest_path = "/predict"
    summary = "Classify texts: the label, its probability and every class's"
    default_setting = "default_classifier"
    threads_setting = "classification_threads"
    cpu_share = 0.25
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

    async def _classify(self, texts: Sequence[str], deadline: float) -> list[list[float]]:
        """Per text its class probabilities, in input order (Python floats: made once per batch
        in the worker thread, not per request on the event loop)."""
        return await self.batcher.submit_many(self.engine.encode(texts), deadline)

    async def answer(self, body: TextsRequest, deadline: float) -> PredictResponse:
        assert isinstance(body, PredictRequest)
        predictions = self.engine.to_predictions(await self._classify(body.texts, deadline))
        attention = None
        if body.return_attention:
            loop = asyncio.get_running_loop()
            tokens, weights = await loop.run_in_executor(self.executor, self.engine.attention, body.texts[0])
            attention = SelfAttention(tokens=tokens, weights=weights.tolist())
        # built from the engine's own values, so not validated again (a few microseconds a text)
        return PredictResponse.model_construct(
            model=self.entry.name,
            version=self.entry.version,
            predictions=[
                Prediction.model_construct(label=p.label, score=p.score, scores=p.scores, attention=attention)
                for p in predictions
            ],
        )

    async def infer(self, texts: list[str], parameters: Mapping[str, Any], deadline: float) -> list[OutputTensor]:
        probs = np.asarray(await self._classify(texts, deadline))  # (N, C)
        n, c = probs.shape
        labels = [self.engine.labels[i] for i in probs.argmax(axis=1)]
        return [
            OutputTensor("label", "BYTES", [n], labels),
            OutputTensor("probabilities", "FP32", [n, c], probs.astype(np.float32).reshape(-1).tolist()),
        ]


def _runner(engine: ClassifierEngine, obs: BatchMetrics) -> Callable[[list[list[int]]], list[list[float]]]:
    def run(seqs: list[list[int]]) -> list[list[float]]:
        t0 = time.perf_counter()
        probs = engine.classify_ids(seqs)  # (B, C)
        obs.compute_time("classify", time.perf_counter() - t0)
        rows: list[list[float]] = probs.tolist()
        return rows

    return run
