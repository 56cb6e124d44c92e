"""Text classification: `POST /predict`, OIP outputs `label` and `probabilities`; texts or, for a
pair classifier (IO contract 7: cross-encoders, NLI), pairs of texts."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Annotated, Any, NamedTuple

import numpy as np
from pydantic import Field, model_validator

from service.engine.classifier import ClassifierEngine, load_classifier, probabilities
from service.engine.runtime import LoadOptions
from service.engine.tokenizer import Encoded
from service.errors import InvalidInput
from service.metrics import BatchMetrics
from service.priority import lower_priority
from service.scheduling.batcher import BatchLimits, DynamicBatcher, Ran
from service.store import StoreEntry
from service.tasks.base import (
    ONE_TEXT_FOR_ATTENTION,
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
    """Classification's per-request option, whatever the protocol: whether an input past the
    model's limit is cut (a pair as transformers' `longest_first` cuts it) instead of refused."""

    truncate: bool = Field(default=False, description="cut an input past the model's token limit instead of a 413")


Pair = Annotated[list[str], Field(min_length=2, max_length=2)]
TEXTS_OR_PAIRS: dict[str, Any] = {"oneOf": [{"required": ["texts"]}, {"required": ["pairs"]}]}
NO_ATTENTION_FOR_PAIRS: dict[str, Any] = {
    "if": {"properties": {"return_attention": {"const": True}}, "required": ["return_attention"]},
    "then": {"not": {"required": ["pairs"]}},
}


class PredictRequest(AttentionRequest, ClassifyOptions):
    model_config = AttentionRequest.model_config | {
        "json_schema_extra": {"allOf": [ONE_TEXT_FOR_ATTENTION, TEXTS_OR_PAIRS, NO_ATTENTION_FOR_PAIRS]}
    }

    texts: list[str] = Field(default_factory=list, min_length=1, description="texts to classify (or `pairs`)")
    pairs: list[Pair] = Field(
        default_factory=list,
        min_length=1,
        description="pairs of texts [a, b] to classify (a cross-encoder's query and document, an NLI premise and "
        "hypothesis), instead of `texts`; a model that takes pairs only",
    )
    model: ModelName | None = Field(default=None, description="model name; default: the only (or default) classifier")
    return_attention: bool = Field(default=False, description="the last layer's self-attention (one text per request)")

    @model_validator(mode="after")
    def _texts_or_pairs(self) -> PredictRequest:
        given = {"texts", "pairs"} & self.model_fields_set
        if len(given) != 1:
            raise ValueError("give either texts or pairs" if given else "texts or pairs is required")
        if self.return_attention and self.pairs:
            raise ValueError("return_attention takes one text, not pairs")
        return self

    @property
    def inputs(self) -> Sequence[str]:
        return [t for pair in self.pairs for t in pair] if self.pairs else self.texts

    @property
    def listed(self) -> tuple[str, int]:
        return ("pairs", len(self.pairs)) if self.pairs else super().listed


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


class Scored(NamedTuple):
    """One input's probabilities and logits, in the labels' order."""

    probs: list[float]
    logits: list[float]


@dataclass(frozen=True)
class Classified:
    """A classification's result: per text (or pair) its class probabilities and logits (the labels' order)."""

    probs: list[list[float]]
    attention: SelfAttention | None = None
    logits: list[list[float]] | None = None


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
        limits = BatchLimits(
            s.max_batch_size,
            s.max_wait_ms / 1000,
            s.max_queue,
            s.max_batch_tokens,
            express_items=s.batch_express_items,
            shared_batch_cost=s.max_batch_tokens_shared,
        )
        self.executor = ThreadPoolExecutor(1, f"classify-{entry.name}", lower_priority)
        self.batcher: DynamicBatcher[Encoded, Scored] = DynamicBatcher(
            entry.name,
            _runner(engine, context.metrics),
            limits,
            size=_tokens,
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
        pairs = {"pairs": True} if self.engine.pairs else {}
        return {"labels": list(self.engine.labels), "max_source_tokens": self.manifest.max_source_tokens, **pairs}

    def outputs(self) -> list[TensorSpec]:
        return [TensorSpec("label", "BYTES", [-1]), TensorSpec("probabilities", "FP32", [-1, len(self.engine.labels)])]

    @classmethod
    def rest_work(cls, body: PredictRequest, deadline: float) -> Work:
        if body.pairs:
            return Work((), body, deadline, pairs=[(a, b) for a, b in body.pairs])
        return super().rest_work(body, deadline)

    def rows(self, work: Work) -> list[Encoded]:
        """The work's inputs framed: pairs only for a model that takes them (InvalidInput, 422)."""
        truncate = isinstance(work.options, ClassifyOptions) and work.options.truncate
        if not work.pairs:
            return self.engine.encode_rows(work.texts, truncate)
        if not self.engine.pairs:
            raise InvalidInput(
                f"model {self.entry.name!r} takes single texts, not pairs (its manifest has no pair framing)"
            )
        return self.engine.encode_pairs(work.pairs, truncate)

    async def run(self, work: Work) -> Classified:
        # the probabilities come as Python floats: made once per batch in the worker thread, not
        # per request on the event loop
        if work.trace is not None:
            return await self._run_traced(work, work.trace)
        return await self._answer(work, await self.batcher.submit_many(self.rows(work), work.deadline))

    async def _run_traced(self, work: Work, trace: Trace) -> Classified:
        """`run`, with its parts as children of the request's span: queue (to its first batch),
        each batch it ran in (items, padded tokens). Tokenizing (tens of microseconds) is no span
        of its own, the time before the queue's: a span costs the export thread ~15 us of CPU
        (docs/deployment.md#tracing), a twentieth of a one-text request's."""
        ids = self.rows(work)
        t1 = time.time_ns()
        trace.set({"gen_ai.usage.input_tokens": sum(len(x.ids) for x in ids)})
        ran: list[Ran] = []
        scored = await self.batcher.submit_many(ids, work.deadline, ran)
        batches = sorted(set(ran), key=lambda b: b.start_ns)
        trace.child("queue", t1, batches[0].start_ns if batches else time.time_ns())
        for b in batches:
            trace.child(
                "batch",
                b.start_ns,
                b.end_ns,
                {"transformer_serve.batch_size": b.items, "transformer_serve.padded_tokens": b.padded},
            )
        return await self._answer(work, scored)

    async def _answer(self, work: Work, scored: list[Scored]) -> Classified:
        probs, logits = [s.probs for s in scored], [s.logits for s in scored]
        attention = None
        if work.attention:
            loop = asyncio.get_running_loop()
            tokens, weights = await loop.run_in_executor(self.executor, self.engine.attention, work.texts[0])
            attention = SelfAttention(tokens=tokens, weights=weights.tolist())
        return Classified(probs, attention, logits)

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


def _tokens(row: Encoded) -> int:
    return len(row.ids)


def _runner(engine: ClassifierEngine, obs: BatchMetrics) -> Callable[[list[Encoded]], list[Scored]]:
    def run(rows: list[Encoded]) -> list[Scored]:
        t0 = time.perf_counter()
        logits = engine.logits_ids([r.ids for r in rows], [r.first for r in rows])  # (B, C)
        probs = probabilities(logits)
        obs.compute_time("classify", time.perf_counter() - t0)
        return [Scored(p, g) for p, g in zip(probs.tolist(), logits.tolist(), strict=True)]

    return run
