"""Translation: `POST /translate`, OIP output `translation`; decoding options per request.

Sentences run on the model's step scheduler.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import Field

from service.engine.decoding import Hypothesis
from service.engine.seq2seq import Generated, Preparation, Prepared, SourceOptions
from service.engine.translation import Sentences
from service.engine.translator import TranslatorEngine
from service.priority import lower_priority
from service.store import StoreEntry
from service.tasks.base import (
    ONE_TEXT_FOR_ATTENTION,
    AttentionRequest,
    LanguageCode,
    ModelName,
    OutputTensor,
    ResponseModel,
    TaskContext,
    TensorSpec,
    Work,
)
from service.tasks.deltas import text_deltas
from service.tasks.options import (
    TEXT_EVENTS_DOC,
    ScoredText,
    SearchOptions,
    Seq2SeqRequest,
    cross_field_rules,
    finite,
    text_events,
)
from service.tasks.seq2seq import Seq2SeqTask


class DecodeOptions(SearchOptions):
    """A translation's options: its decoding and, for a multilingual model, its languages."""

    model_config = SearchOptions.model_config
    source_language: LanguageCode | None = Field(
        default=None, description="a multilingual model's source language (GET /v1/models lists them); default: its own"
    )
    target_language: LanguageCode | None = Field(
        default=None, description="a multilingual model's target language; default: its own"
    )

    def source_options(self) -> SourceOptions:
        return SourceOptions(self.source_language, self.target_language)


ONE_OUTPUT_TO_STREAM: dict[str, Any] = {
    "if": {"properties": {"stream": {"const": True}}, "required": ["stream"]},
    "then": {"properties": {"num_hypotheses": {"maximum": 1}, "return_attention": {"const": False}}},
}
"""The API document's form of the rule "a stream carries one output per text, no attention" (a 400)."""


class TranslateRequest(AttentionRequest, Seq2SeqRequest, DecodeOptions):
    model_config = DecodeOptions.model_config | {
        "json_schema_extra": {"allOf": [*cross_field_rules()["allOf"], ONE_TEXT_FOR_ATTENTION, ONE_OUTPUT_TO_STREAM]}
    }

    texts: list[str] = Field(min_length=1, description="texts to translate")
    model: ModelName | None = Field(default=None, description="model name; default: the only (or default) translator")
    return_attention: bool = Field(
        default=False, description="cross-attention of the best hypothesis, per sentence (one text per request)"
    )

    def stream_conflicts(self) -> list[str]:
        return [*super().stream_conflicts(), *(["return_attention"] if self.return_attention else [])]


class CrossAttention(ResponseModel):
    """One sentence: which source tokens each generated token attended to."""

    source_tokens: list[str]
    target_tokens: list[str]
    weights: list[list[list[list[float]]]] = Field(description="[layer][head][target][source]; rows sum to 1")


class Translation(ResponseModel):
    text: str
    finish_reason: Literal["eos", "length"] = Field(description="eos: ended; length: cut at max_new_tokens")
    score: float | None = None
    hypotheses: list[ScoredText] | None = None
    attention: list[CrossAttention] | None = Field(default=None, description="per sentence of the text")
    spans_appended: int | None = Field(
        default=None,
        ge=1,
        description="protected spans (URLs, code, numbers, ...) the translation reached max_new_tokens without: "
        "each was appended at the end of its sentence; absent when every span is in place",
    )


class TranslateResponse(ResponseModel):
    model: str
    version: int
    translations: list[Translation]


@dataclass(frozen=True)
class Translated:
    """A translation's result: per text its hypotheses, best first, and on request the best
    hypothesis's cross-attention per sentence (one text)."""

    rows: list[list[Generated]]
    attention: list[CrossAttention] | None = None


class TranslationTask(Seq2SeqTask[TranslateRequest, Translated]):
    name = "translation"
    rest_path = "/translate"
    summary = "Translate texts with greedy, beam-search or sampled decoding"
    default_setting = "default_translator"
    threads_setting = "translation_threads"
    Options = DecodeOptions
    Request = TranslateRequest
    Response = TranslateResponse
    rest_events_doc = TEXT_EVENTS_DOC

    def __init__(self, entry: StoreEntry, engine: TranslatorEngine, context: TaskContext) -> None:
        super().__init__(entry, engine, context)
        self.attention_worker = ThreadPoolExecutor(1, f"attention-{entry.name}", lower_priority)

    @staticmethod
    def plug_in(engine: TranslatorEngine) -> Preparation[Sentences]:
        return engine.translation

    async def close(self, timeout: float) -> None:
        await super().close(timeout)
        self.attention_worker.shutdown(wait=False, cancel_futures=True)

    def describe(self) -> Mapping[str, object]:
        m = self.manifest
        sources, targets = self.engine.languages()
        return {
            "max_source_tokens": m.max_source_tokens,
            "max_new_tokens": m.max_new_tokens,
            "source_language": m.source_language,
            "target_language": m.target_language,
            "source_languages": sources,
            "target_languages": targets,
        }

    def outputs(self) -> list[TensorSpec]:
        return [TensorSpec("translation", "BYTES", [-1])]

    async def _attention(self, prepared: Prepared, hyps: list[list[Hypothesis]]) -> list[CrossAttention]:
        """Replays each sentence's best hypothesis for its attention, off the scheduler's thread."""

        def maps() -> list[CrossAttention]:
            out = []
            for source, row in zip(prepared.sources, hyps, strict=True):
                m = self.engine.attention(source, row[0])
                weights = m.weights.tolist()
                out.append(
                    CrossAttention(source_tokens=m.source_tokens, target_tokens=m.target_tokens, weights=weights)
                )
            return out

        return await asyncio.get_running_loop().run_in_executor(self.attention_worker, maps)

    async def run(self, work: Work) -> Translated:
        assert isinstance(work.options, DecodeOptions)
        done = await self.answer(work)
        attention = await self._attention(done.prepared, done.hypotheses) if work.attention else None
        return Translated(done.outputs, attention)

    def rest_events(self, body: TranslateRequest, work: Work) -> AsyncIterator[Mapping[str, object]]:
        return text_events(text_deltas(self, work), body.return_scores)

    def tensors(self, result: Translated) -> list[OutputTensor]:
        return [OutputTensor("translation", "BYTES", [len(result.rows)], [row[0].text for row in result.rows])]

    def rest_answer(self, body: TranslateRequest, result: Translated) -> TranslateResponse:
        out = []
        for row in result.rows:
            best = row[0]
            out.append(
                Translation(
                    text=best.text,
                    finish_reason=best.finish_reason,
                    score=finite(best.score) if body.return_scores else None,
                    hypotheses=[
                        ScoredText(text=t.text, score=finite(t.score), finish_reason=t.finish_reason) for t in row
                    ]
                    if body.num_hypotheses > 1
                    else None,
                    attention=result.attention,
                    spans_appended=best.spans_appended or None,
                )
            )
        return TranslateResponse(model=self.entry.name, version=self.entry.version, translations=out)
