"""The options of every sequence-to-sequence request (`/translate`, `/generate`, completions):
how it decodes (`SearchOptions`: greedy, beam, sampling, penalties, lengths), the fields every
such REST body has (`Seq2SeqRequest`: scores, a deadline, a stream), and its answer's pieces.

A task's own options extend `SearchOptions` with what its sources need (a translator's languages,
a text-to-text model's truncation: `source_options`).
"""

from __future__ import annotations

import contextlib
import hashlib
import math
import time
from collections.abc import AsyncGenerator, Mapping
from typing import Annotated, Any, Literal

from pydantic import Field, model_validator

from service.contract.manifest import Generation
from service.engine.decoding import MAX_BEAM_SIZE, DecodeParams
from service.engine.seq2seq import SourceOptions
from service.errors import InvalidInput
from service.tasks.base import INTEGRAL, Int, ResponseModel, StrictModel, TextsRequest
from service.tasks.deltas import Delta, TextEvent

MAX_NEW_TOKENS = 256  # the request bound; each model's own limit (manifest) may be lower


def cross_field_rules() -> dict[str, Any]:
    """`SearchOptions._consistent` as JSON Schema `if`/`then`, for the API document, so a client
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


class SearchOptions(StrictModel):
    """How a sequence-to-sequence request decodes, whatever its task and protocol: a request that
    leaves an option out gets the model's own default (its generation config)."""

    model_config = StrictModel.model_config | {"json_schema_extra": cross_field_rules()}

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
    min_new_tokens: Annotated[int, Field(ge=0, le=MAX_NEW_TOKENS), INTEGRAL] | None = Field(
        default=None,
        description="no end before this many generated tokens (past max_new_tokens: cut there); default: the model's",
    )

    @model_validator(mode="after")
    def _consistent(self) -> SearchOptions:
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
        # a minimum past the maximum ends every output at the maximum, as transformers' does
        least = min(self.min_new_tokens if self.min_new_tokens is not None else d.min_new_tokens, wanted)
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
            seed=sentence_seed(self.seed, sentence) if self.decode == "sample" else 0,  # two hashes: only to draw
            repetition_penalty=self.repetition_penalty,
            no_repeat_ngram_size=self.no_repeat_ngram_size
            if "no_repeat_ngram_size" in given
            else d.no_repeat_ngram_size,
            early_stopping=d.early_stopping,
            min_new_tokens=least,
        )

    def source_options(self) -> SourceOptions:
        """What the request says of its sources besides decoding (a task's options add to it)."""
        return SourceOptions()


def sentence_seed(seed: int | None, sentence: int) -> int:
    """Each sentence draws from its own generator: the request's seed and the sentence's place."""
    base = seed if seed is not None else int.from_bytes(hashlib.sha256(str(time.time_ns()).encode()).digest()[:8])
    return int.from_bytes(hashlib.sha256(f"{base}:{sentence}".encode()).digest()[:8], "big") >> 1


class Seq2SeqRequest(TextsRequest, SearchOptions):
    """What every sequence-to-sequence REST body has besides its texts and options: scores, its
    own deadline, a stream (one output per text)."""

    return_scores: bool = False
    timeout_ms: Annotated[int, Field(ge=1, le=3_600_000), INTEGRAL] | None = Field(
        default=None, description="this request's deadline; the server's is the upper bound"
    )
    stream: bool = Field(
        default=False,
        description="answer text/event-stream: per text its output as deltas, a last event with its "
        "finish_reason (and score), then [DONE]; one output per text (not num_hypotheses > 1, nor attention)",
    )

    @property
    def timeout_s(self) -> float | None:
        return self.timeout_ms / 1000 if self.timeout_ms is not None else None

    @property
    def streamed(self) -> bool:
        return self.stream

    def stream_conflicts(self) -> list[str]:
        return ["num_hypotheses"] if self.num_hypotheses > 1 else []


TEXT_EVENTS_DOC = """With "stream": true, Server-Sent Events: `data: {"index": i, "text": "<delta>"}` as text
i's output grows (its deltas joined are the text answered without stream), `data: {"index": i,
"text": "", "finish_reason": ..., "score"?: ..., "spans_appended"?: ...}` once text i is complete (the
last: protected spans put at the end of a text cut at its limit), then `data: [DONE]`. An
error after the first event is `data: {"error": ..., "type": ...}`, then the stream ends; before it,
the JSON error and its status."""
"""A sequence-to-sequence REST stream's events (`text_events`), for the API document."""


class ScoredText(ResponseModel):
    text: str
    score: float
    finish_reason: Literal["eos", "length"]


async def text_events(
    deltas: AsyncGenerator[TextEvent, None], scores: bool
) -> AsyncGenerator[Mapping[str, object], None]:
    """A stream of texts' outputs: `{"index", "text"}` per delta; per text, last, its `finish_reason` (and score)."""
    async with contextlib.aclosing(deltas) as events:
        async for event in events:
            if isinstance(event, Delta):
                yield {"index": event.index, "text": event.text}
            else:
                end: dict[str, object] = {"index": event.index, "text": "", "finish_reason": event.output.finish_reason}
                if scores:
                    end["score"] = finite(event.output.score)
                if event.output.spans_appended:
                    end["spans_appended"] = event.output.spans_appended
                yield end


def finite(x: float) -> float:
    """JSON has no -inf: a hypothesis with an impossible token gets the lowest finite score."""
    return x if math.isfinite(x) else -1e30
