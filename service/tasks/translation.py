"""Translation: `POST /translate`, OIP output `translation`; decoding options per request."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import Field, ValidationError, model_validator

from service.engine.decoding import MAX_BEAM_SIZE, DecodeParams, Hypothesis
from service.engine.runtime import LoadOptions
from service.engine.translator import TranslatorEngine, load_translator
from service.errors import InvalidInput
from service.metrics import BatchMetrics
from service.scheduling.batcher import BatchLimits, DynamicBatcher
from service.store import StoreEntry
from service.tasks.base import (
    ModelName,
    OutputTensor,
    ResponseModel,
    StrictModel,
    Task,
    TaskContext,
    TensorSpec,
    TextsRequest,
)
from service.validation import describe_validation, field_rules

MAX_NEW_TOKENS = 256  # the request bound; each model's own limit (manifest) may be lower


class DecodeOptions(StrictModel):
    decode: Literal["beam", "greedy"] = Field(default="beam", description="greedy is beam_size 1")
    beam_size: int = Field(default=4, ge=1, le=MAX_BEAM_SIZE)
    max_new_tokens: int | None = Field(
        default=None, ge=1, le=MAX_NEW_TOKENS, description="generated tokens incl. EOS; default: the model's limit"
    )
    length_penalty: float = Field(default=1.0, ge=0.0, le=2.0)
    num_hypotheses: int = Field(default=1, ge=1, le=MAX_BEAM_SIZE, description="1..beam_size, returned best first")

    @model_validator(mode="after")
    def _consistent(self) -> DecodeOptions:
        if self.decode == "greedy":
            if "beam_size" in self.model_fields_set and self.beam_size != 1:
                raise ValueError(f"decode 'greedy' means beam_size 1, got beam_size {self.beam_size}")
            self.beam_size = 1
        if self.num_hypotheses > self.beam_size:
            raise ValueError(f"num_hypotheses must be between 1 and beam_size ({self.beam_size})")
        return self

    def params(self, model_limit: int) -> DecodeParams:
        """Decode parameters for a model whose manifest allows `model_limit` new tokens."""
        wanted = self.max_new_tokens if self.max_new_tokens is not None else model_limit
        if wanted > model_limit:
            raise InvalidInput(f"max_new_tokens must be between 1 and {model_limit} for this model, got {wanted}")
        return DecodeParams(self.beam_size, wanted, self.length_penalty, self.num_hypotheses)


DECODE_RULES = field_rules(DecodeOptions)


class TranslateRequest(TextsRequest, DecodeOptions):
    texts: list[str] = Field(min_length=1, description="texts to translate")
    model: ModelName | None = Field(default=None, description="model name; default: the only (or default) translator")
    return_scores: bool = False


class Hypothesis_(ResponseModel):
    text: str
    score: float


class Translation(ResponseModel):
    text: str
    score: float | None = None
    hypotheses: list[Hypothesis_] | None = None


class TranslateResponse(ResponseModel):
    model: str
    version: int
    translations: list[Translation]


@dataclass(frozen=True)
class TranslateItem:
    ids: list[int]
    params: DecodeParams  # max_new_tokens is this item's own limit


def decode_key(item: TranslateItem) -> tuple[int, float, int]:
    """Items batch together when they decode alike; max_new_tokens may differ (per-row limits)."""
    p = item.params
    return (p.beam_size, p.length_penalty, p.num_hypotheses)


class TranslationTask(Task):
    name = "translation"
    rest_path = "/translate"
    summary = "Translate texts with greedy or beam-search decoding"
    default_setting = "default_translator"
    Request = TranslateRequest
    Response = TranslateResponse

    def __init__(self, entry: StoreEntry, engine: TranslatorEngine, context: TaskContext) -> None:
        super().__init__(entry, engine.variant)
        self.engine = engine
        s = context.settings
        limits = BatchLimits(s.max_batch_size, s.max_wait_ms / 1000, s.max_queue, s.max_batch_tokens)
        self.batcher: DynamicBatcher[TranslateItem, list[Hypothesis]] = DynamicBatcher(
            entry.name,
            _runner(engine, context.metrics),
            limits,
            key=decode_key,
            size=lambda it: len(it.ids) * it.params.beam_size,
            executor=context.executor,
            observer=context.metrics,
        )

    @classmethod
    def load(cls, entry: StoreEntry, options: LoadOptions, context: TaskContext) -> TranslationTask:
        engine = load_translator(entry, options)
        engine.warmup()
        return cls(entry, engine, context)

    def start(self) -> None:
        self.batcher.start()

    async def close(self, timeout: float) -> None:
        await self.batcher.close(timeout)

    @property
    def in_flight(self) -> int:
        return self.batcher.in_flight

    def describe(self) -> Mapping[str, object]:
        m = self.manifest
        return {"max_source_tokens": m.max_source_tokens, "max_new_tokens": m.max_new_tokens}

    def outputs(self) -> list[TensorSpec]:
        return [TensorSpec("translation", "BYTES", [-1])]

    async def _translate(self, texts: Sequence[str], options: DecodeOptions, deadline: float) -> list[list[Hypothesis]]:
        params = options.params(self.engine.max_new_tokens)
        items = [TranslateItem(ids, params) for ids in self.engine.encode(texts)]
        return await self.batcher.submit_many(items, deadline)

    async def answer(self, body: TextsRequest, deadline: float) -> TranslateResponse:
        assert isinstance(body, TranslateRequest)
        hyps = await self._translate(body.texts, body, deadline)
        out = []
        for row in self.engine.to_translations(hyps):
            best = row[0]
            out.append(
                Translation(
                    text=best.text,
                    score=finite(best.score) if body.return_scores else None,
                    hypotheses=[Hypothesis_(text=t.text, score=finite(t.score)) for t in row]
                    if body.num_hypotheses > 1
                    else None,
                )
            )
        return TranslateResponse(model=self.entry.name, version=self.entry.version, translations=out)

    async def infer(self, texts: list[str], parameters: Mapping[str, Any], deadline: float) -> list[OutputTensor]:
        chosen = {k: v for k, v in parameters.items() if k in DecodeOptions.model_fields}  # others are ignored
        try:
            options = DecodeOptions.model_validate(chosen)
        except ValidationError as exc:
            raise InvalidInput(describe_validation(exc.errors(), DECODE_RULES, prefix="parameters.")) from None
        best = [row[0].text for row in self.engine.to_translations(await self._translate(texts, options, deadline))]
        return [OutputTensor("translation", "BYTES", [len(texts)], best)]


def finite(x: float) -> float:
    """JSON has no -inf: a hypothesis with an impossible token gets the lowest finite score."""
    return x if math.isfinite(x) else -1e30


def _runner(engine: TranslatorEngine, obs: BatchMetrics) -> Callable[[list[TranslateItem]], list[list[Hypothesis]]]:
    def run(items: list[TranslateItem]) -> list[list[Hypothesis]]:
        limits = [it.params.max_new_tokens for it in items]
        params = dataclasses.replace(items[0].params, max_new_tokens=max(limits))
        hyps = engine.translate_ids([it.ids for it in items], params, limits, timer=obs.compute_time)
        obs.generated(sum(len(h[0].tokens) + int(h[0].finished) for h in hyps if h))
        return hyps

    return run
