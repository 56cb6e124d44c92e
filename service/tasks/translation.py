"""Translation: `POST /translate`, OIP output `translation`; decoding options per request.

Sentences run on the model's step scheduler.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import math
import time
from collections.abc import AsyncGenerator, AsyncIterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import Field, model_validator

from service.contract.manifest import Generation
from service.engine.decoding import MAX_BEAM_SIZE, DecodeParams, Hypothesis
from service.engine.seq2seq import Generated, Preparation, Prepared
from service.engine.translation import Sentences
from service.engine.translator import TranslatorEngine
from service.errors import InvalidInput
from service.priority import lower_priority
from service.store import StoreEntry
from service.tasks.base import (
    INTEGRAL,
    ONE_TEXT_FOR_ATTENTION,
    AttentionRequest,
    Int,
    LanguageCode,
    ModelName,
    OutputTensor,
    ResponseModel,
    StrictModel,
    TaskContext,
    TensorSpec,
    Work,
)
from service.tasks.deltas import Delta, TextEvent, text_deltas
from service.tasks.seq2seq import Seq2SeqTask
from service.tracing import Trace

MAX_NEW_TOKENS = 256  # the request bound; each model's own limit (manifest) may be lower


def _cross_field_rules() -> dict[str, Any]:
    """`DecodeOptions._consistent` as JSON Schema `if`/`then`, for the API document, so a client
    generating requests from it never meets a 422 the document did not announce. JSON Schema
    cannot compare two fields, so "num_hypotheses <= beam_size" is one rule per beam size;
    tests/test_api_document.py checks that schema and validator accept the same requests."""
    one_beam = {"if": {"properties": {"decode": {"enum": ["greedy", "sample"]}}, "required": ["decode"]}}
    rules: list[dict[str, Any]] = [
        one_beam | {"then": {"properties": {"beam_size": {"const": 1}}}},
        {
            "if": {"properties": {"decode": {"const": "greedy"}}, "required": ["decode"]},
            "then": {"properties": {"num_hypotheses": {"maximum": 1}}},
        },
        {
            "if": {"properties": {"decode": {"const": "beam"}}, "not": {"required": ["beam_size"]}},
            "then": {"properties": {"num_hypotheses": {"maximum": DEFAULT_BEAM_SIZE}}},
        },
    ]
    for size in range(1, MAX_BEAM_SIZE):
        rules.append(
            {
                "if": {
                    "properties": {"decode": {"const": "beam"}, "beam_size": {"const": size}},
                    "required": ["beam_size"],
                },
                "then": {"properties": {"num_hypotheses": {"maximum": size}}},
            }
        )
    return {"allOf": rules}


DEFAULT_BEAM_SIZE = 4


class DecodeOptions(StrictModel):
    model_config = StrictModel.model_config | {"json_schema_extra": _cross_field_rules()}

    decode: Literal["beam", "greedy", "sample"] = Field(
        default="beam", description="greedy is beam_size 1; sample draws tokens (temperature, top_k, top_p, seed)"
    )
    beam_size: Int = Field(default=DEFAULT_BEAM_SIZE, ge=1, le=MAX_BEAM_SIZE)
    max_new_tokens: Annotated[int, Field(ge=1, le=MAX_NEW_TOKENS), INTEGRAL] | None = Field(
        default=None, description="generated tokens incl. EOS; default: the model's limit"
    )
    length_penalty: float = Field(default=1.0, ge=0.0, le=2.0)
    num_hypotheses: Int = Field(
        default=1, ge=1, le=MAX_BEAM_SIZE, description="beam: 1..beam_size, best first; sample: independent draws"
    )
    temperature: float = Field(default=1.0, gt=0.0, le=100.0, description="sample: softmax temperature")
    top_k: Int = Field(default=0, ge=0, description="sample: draw among the k likeliest tokens; 0: all")
    top_p: float = Field(default=1.0, gt=0.0, le=1.0, description="sample: draw within this probability mass")
    seed: Annotated[int, Field(ge=0, le=2**53 - 1), INTEGRAL] | None = Field(
        default=None, description="sample: same seed, same draws (up to 2^53 - 1: exact in every JSON parser)"
    )
    repetition_penalty: float = Field(
        default=1.0, gt=0.0, le=100.0, description="a generated token's log-probability is multiplied by it"
    )
    no_repeat_ngram_size: Int = Field(default=0, ge=0, le=16, description="no n-gram of this size occurs twice; 0: off")
    source_language: LanguageCode | None = Field(
        default=None, description="a multilingual model's source language (GET /v1/models lists them); default: its own"
    )
    target_language: LanguageCode | None = Field(
        default=None, description="a multilingual model's target language; default: its own"
    )

    @model_validator(mode="after")
    def _consistent(self) -> DecodeOptions:
        if self.decode in ("greedy", "sample"):
            if "beam_size" in self.model_fields_set and self.beam_size != 1:
                raise ValueError(f"decode {self.decode!r} means beam_size 1, got beam_size {self.beam_size}")
            self.beam_size = 1
        if self.decode != "sample" and self.num_hypotheses > self.beam_size:
            raise ValueError(f"num_hypotheses must be between 1 and beam_size ({self.beam_size})")
        return self

    def params(self, model_limit: int, sentence: int, defaults: Generation | None = None) -> DecodeParams:
        """Decode parameters of the request's `sentence`-th sentence for a model allowing
        `model_limit` tokens; what the request leaves out comes from the model's `defaults`."""
        wanted = self.max_new_tokens if self.max_new_tokens is not None else model_limit
        if wanted > model_limit:
            raise InvalidInput(f"max_new_tokens must be between 1 and {model_limit} for this model")
        given, d = self.model_fields_set, defaults or Generation()
        beam = self.beam_size
        if "beam_size" not in given and self.decode == "beam":  # the model's, widened to the hypotheses asked
            beam = max(d.beam_size, self.num_hypotheses)
        return DecodeParams(
            beam_size=beam,
            max_new_tokens=wanted,
            length_penalty=self.length_penalty if "length_penalty" in given else d.length_penalty,
            num_hypotheses=self.num_hypotheses,
            sample=self.decode == "sample",
            temperature=self.temperature,
            top_k=self.top_k,
            top_p=self.top_p,
            seed=_sentence_seed(self.seed, sentence) if self.decode == "sample" else 0,  # two hashes: only to draw
            repetition_penalty=self.repetition_penalty,
            no_repeat_ngram_size=self.no_repeat_ngram_size
            if "no_repeat_ngram_size" in given
            else d.no_repeat_ngram_size,
            early_stopping=d.early_stopping,
        )


def _sentence_seed(seed: int | None, sentence: int) -> int:
    """Each sentence draws from its own generator: the request's seed and the sentence's place."""
    base = seed if seed is not None else int.from_bytes(hashlib.sha256(str(time.time_ns()).encode()).digest()[:8])
    return int.from_bytes(hashlib.sha256(f"{base}:{sentence}".encode()).digest()[:8], "big") >> 1


ONE_OUTPUT_TO_STREAM: dict[str, Any] = {
    "if": {"properties": {"stream": {"const": True}}, "required": ["stream"]},
    "then": {"properties": {"num_hypotheses": {"maximum": 1}, "return_attention": {"const": False}}},
}
"""The API document's form of the rule "a stream carries one output per text, no attention" (a 400)."""


class TranslateRequest(AttentionRequest, DecodeOptions):
    model_config = DecodeOptions.model_config | {
        "json_schema_extra": {"allOf": [*_cross_field_rules()["allOf"], ONE_TEXT_FOR_ATTENTION, ONE_OUTPUT_TO_STREAM]}
    }

    texts: list[str] = Field(min_length=1, description="texts to translate")
    model: ModelName | None = Field(default=None, description="model name; default: the only (or default) translator")
    return_scores: bool = False
    timeout_ms: Annotated[int, Field(ge=1, le=3_600_000), INTEGRAL] | None = Field(
        default=None, description="this request's deadline; the server's is the upper bound"
    )
    return_attention: bool = Field(
        default=False, description="cross-attention of the best hypothesis, per sentence (one text per request)"
    )
    stream: bool = Field(
        default=False,
        description="answer text/event-stream: per text its final text as deltas, a last event with its "
        "finish_reason (and score), then [DONE]; not with num_hypotheses > 1 or return_attention",
    )

    @property
    def timeout_s(self) -> float | None:
        return self.timeout_ms / 1000 if self.timeout_ms is not None else None

    @property
    def streamed(self) -> bool:
        return self.stream

    def stream_conflicts(self) -> list[str]:
        return [
            name
            for name, on in (("num_hypotheses", self.num_hypotheses > 1), ("return_attention", self.return_attention))
            if on
        ]


class ScoredText(ResponseModel):
    text: str
    score: float
    finish_reason: Literal["eos", "length"]


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
    rest_events_doc = """With "stream": true, Server-Sent Events: `data: {"index": i, "text": "<delta>"}` as text
    i's output grows (its deltas joined are the text answered without stream), `data: {"index": i,
    "text": "", "finish_reason": ..., "score"?: ...}` once text i is complete, then `data: [DONE]`. An
    error after the first event is `data: {"error": ..., "type": ...}`, then the stream ends; before it,
    the JSON error and its status."""

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

    async def run_traced(self, work: Work, trace: Trace) -> Translated:
        """`run`, with its parts as children of the request's span (`Seq2SeqTask.stream`)."""
        assert isinstance(work.options, DecodeOptions)
        done = await self.answer(work, trace)
        attention = await self._attention(done.prepared, done.hypotheses) if work.attention else None
        return Translated(done.outputs, attention)

    def rest_events(self, body: TranslateRequest, work: Work) -> AsyncIterator[Mapping[str, object]]:
        return _events(text_deltas(self, work), body.return_scores)

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
                )
            )
        return TranslateResponse(model=self.entry.name, version=self.entry.version, translations=out)


async def _events(deltas: AsyncGenerator[TextEvent, None], scores: bool) -> AsyncGenerator[Mapping[str, object], None]:
    """A translation's stream: `{"index", "text"}` per delta; per text, last, its `finish_reason` (and score)."""
    async with contextlib.aclosing(deltas) as events:
        async for event in events:
            if isinstance(event, Delta):
                yield {"index": event.index, "text": event.text}
            else:
                end: dict[str, object] = {"index": event.index, "text": "", "finish_reason": event.output.finish_reason}
                if scores:
                    end["score"] = finite(event.output.score)
                yield end


def finite(x: float) -> float:
    """JSON has no -inf: a hypothesis with an impossible token gets the lowest finite score."""
    return x if math.isfinite(x) else -1e30
