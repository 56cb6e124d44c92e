"""Text-to-text: `POST /generate`, OIP output `generation`; a summarizer or an instruction model
(T5, Flan-T5, BART-CNN) reads each text whole.

The sequence-to-sequence task with the whole-text plug-in (`seq2seq.WholeText`: no sentence
splitting, no masks, the model's prefix first); the same decoding options as a translation, and
`truncate` for a text past the model's limit (refused with 413 otherwise).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from typing import Any, Literal

from pydantic import Field

from service.engine.seq2seq import Generated, Preparation, SourceOptions
from service.engine.translator import TranslatorEngine
from service.tasks.base import ModelName, OutputTensor, ResponseModel, TensorSpec, Work
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

ONE_GENERATION_TO_STREAM: dict[str, Any] = {
    "if": {"properties": {"stream": {"const": True}}, "required": ["stream"]},
    "then": {"properties": {"num_hypotheses": {"maximum": 1}}},
}
"""The API document's form of the rule "a stream carries one output per text" (a 400)."""


class GenerateOptions(SearchOptions):
    """A generation's options: its decoding, and what to do with a text past the model's limit."""

    model_config = SearchOptions.model_config
    truncate: bool = Field(
        default=False, description="a text past the model's limit (max_source_tokens) loses its end; false: 413"
    )

    def source_options(self) -> SourceOptions:
        return SourceOptions(truncate=self.truncate)


class GenerateRequest(Seq2SeqRequest, GenerateOptions):
    model_config = GenerateOptions.model_config | {
        "json_schema_extra": {"allOf": [*cross_field_rules()["allOf"], ONE_GENERATION_TO_STREAM]}
    }

    texts: list[str] = Field(min_length=1, description="input texts, each read whole (after the model's prefix)")
    model: ModelName | None = Field(default=None, description="model name; default: the only (or default) one")


class Generation(ResponseModel):
    text: str
    finish_reason: Literal["eos", "length"] = Field(description="eos: ended; length: cut at max_new_tokens")
    score: float | None = None
    hypotheses: list[ScoredText] | None = None


class GenerateResponse(ResponseModel):
    model: str
    version: int
    generations: list[Generation]


class Text2TextTask(Seq2SeqTask[GenerateRequest, list[list[Generated]]]):
    name = "text2text"
    rest_path = "/generate"
    summary = "Generate text from each text (summarize, answer, rewrite) with greedy, beam-search or sampled decoding"
    default_setting = "default_generator"
    threads_setting = "text2text_threads"
    Options = GenerateOptions
    Request = GenerateRequest
    Response = GenerateResponse
    rest_events_doc = TEXT_EVENTS_DOC

    @staticmethod
    def plug_in(engine: TranslatorEngine) -> Preparation[Any]:
        return engine.whole_text

    def describe(self) -> Mapping[str, object]:
        m = self.manifest
        return {"max_source_tokens": m.max_source_tokens, "max_new_tokens": m.max_new_tokens, "prefix": m.prefix}

    def outputs(self) -> list[TensorSpec]:
        return [TensorSpec("generation", "BYTES", [-1])]

    def tensors(self, result: list[list[Generated]]) -> list[OutputTensor]:
        return [OutputTensor("generation", "BYTES", [len(result)], [row[0].text for row in result])]

    def rest_events(self, body: GenerateRequest, work: Work) -> AsyncIterator[Mapping[str, object]]:
        return text_events(text_deltas(self, work), body.return_scores)

    def rest_answer(self, body: GenerateRequest, result: list[list[Generated]]) -> GenerateResponse:
        out = []
        for row in result:
            best = row[0]
            hypotheses = None
            if body.num_hypotheses > 1:
                hypotheses = [
                    ScoredText(text=t.text, score=finite(t.score), finish_reason=t.finish_reason) for t in row
                ]
            score = finite(best.score) if body.return_scores else None
            out.append(Generation(text=best.text, finish_reason=best.finish_reason, score=score, hypotheses=hypotheses))
        return GenerateResponse(model=self.entry.name, version=self.entry.version, generations=out)
