"""OpenAI's completions API over every sequence-to-sequence model (`POST /v1/completions`).

A completions body is read as vLLM reads it: `prompt` a string or a list, `max_tokens`, `n`,
`temperature` (0: greedy; otherwise sampling with `top_p`, `top_k`, `seed`), `stop`, and beam
search through vLLM's extra fields (`use_beam_search`, `best_of` as the beam width,
`length_penalty`). It becomes the model's own task options (a translator's or a text-to-text
model's), so the answer is what `/translate` or `/generate` gives for the same options; the
answer is a `text_completion` with `usage`, or with `"stream": true` its chunks (`stream_options.
include_usage`: a last chunk with the usage). Errors are OpenAI's shape (`Protocol.OPENAI`). What
OpenAI's API has and a sequence-to-sequence model cannot do (`echo`, `suffix`, `logprobs`,
presence and frequency penalties, `logit_bias`) is refused when asked for, never ignored.
"""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import AsyncGenerator, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import Field, ValidationError, model_validator
from starlette.types import ASGIApp

from service.errors import InvalidInput
from service.http import schemas
from service.http.dispatch import json_answer
from service.http.events import event_stream
from service.http.pipeline import Codec, Decoded, Run
from service.http.rest import TASK_ERRORS
from service.http.scope import Call
from service.http.table import Auth, Protocol, Route, Served
from service.serving import ModelSet
from service.settings import Settings
from service.tasks import registry
from service.tasks.base import INTEGRAL, ModelName, ResponseModel, StrictModel, Task, Work
from service.tasks.deltas import Delta, text_deltas, usage
from service.tasks.options import DEFAULT_BEAM_SIZE, MAX_BEAM_SIZE, MAX_NEW_TOKENS
from service.tasks.seq2seq import Done, Seq2SeqTask
from service.validation import describe_validation

MAX_STOPS = 4  # OpenAI's bound on `stop`
MAX_STOP_CHARS = 256
FINISH = {"eos": "stop", "length": "length"}


class StreamOptions(StrictModel):
    include_usage: bool = Field(default=False, description="a last chunk with `usage` and no choices")


Count = Annotated[int, Field(ge=1, le=MAX_BEAM_SIZE), INTEGRAL]
Stop = Annotated[str, Field(min_length=1, max_length=MAX_STOP_CHARS)]


def _off(value: object) -> Callable[[dict[str, Any]], None]:
    """The API document's form of an OpenAI field this server does not do: only its "off" value."""

    def schema(s: dict[str, Any]) -> None:
        description = s.get("description", "")
        s.clear()
        s.update({"const": value, "description": description})

    return schema


def _cross_field_rules() -> dict[str, Any]:
    """`CompletionRequest`'s rules between fields as JSON Schema `if`/`then`, one per value where
    two fields are compared (JSON Schema cannot compare them), so the document announces every 422."""
    beam = {"properties": {"use_beam_search": {"const": True}}, "required": ["use_beam_search"]}
    rules: list[dict[str, Any]] = [
        {
            "if": {"properties": {"stream": {"const": True}}, "required": ["stream"]},
            "then": {"properties": {"n": {"maximum": 1}}, "anyOf": [beam, {"properties": {"best_of": {"maximum": 1}}}]},
        }
    ]
    for k in range(1, MAX_BEAM_SIZE):
        rules.append(
            {
                "if": {"properties": {"best_of": {"const": k}}, "required": ["best_of"]},
                "then": {"properties": {"n": {"maximum": k}}},
            }
        )
    return {"allOf": rules}


class CompletionRequest(StrictModel):
    """OpenAI's completions body, with vLLM's beam-search fields."""

    model_config = StrictModel.model_config | {"json_schema_extra": _cross_field_rules()}

    model: ModelName = Field(description="a served translator or text-to-text model (GET /v1/models)")
    prompt: str | Annotated[list[str], Field(min_length=1)] = Field(description="one text, or a list of texts")
    max_tokens: Annotated[int, Field(ge=1, le=MAX_NEW_TOKENS), INTEGRAL] | None = Field(
        default=None, description="generated tokens incl. the end; default: the model's limit (not OpenAI's 16)"
    )
    min_tokens: Annotated[int, Field(ge=0, le=MAX_NEW_TOKENS), INTEGRAL] | None = Field(
        default=None, description="no end before this many tokens (vLLM's field); default: the model's"
    )
    temperature: float = Field(default=1.0, ge=0.0, le=2.0, description="0: greedy; otherwise sampling")
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    top_k: Annotated[int, Field(ge=-1), INTEGRAL] = Field(default=-1, description="-1 or 0: every token")
    n: Count = Field(default=1, description="outputs per prompt (at most best_of)")
    best_of: Count | None = Field(
        default=None,
        description="sampling: draws per prompt, the n likeliest answered; with use_beam_search: the beam width",
    )
    use_beam_search: bool = Field(default=False, description="beam search (vLLM's field); temperature is not read")
    length_penalty: float | None = Field(default=None, ge=0.0, le=2.0, description="beam search; default: the model's")
    repetition_penalty: float | None = Field(default=None, gt=0.0, le=100.0)
    seed: Annotated[int, Field(ge=0, le=2**53 - 1), INTEGRAL] | None = None
    stop: Stop | Annotated[list[Stop], Field(max_length=MAX_STOPS)] | None = Field(
        default=None, description="up to 4 texts; an output ends before the first it contains (finish_reason stop)"
    )
    stream: bool = Field(default=False, description="chunks as they are produced; n 1, best_of 1 unless beam search")
    stream_options: StreamOptions | None = None
    echo: bool = Field(default=False, description="not supported: false only", json_schema_extra=_off(False))
    logprobs: Annotated[int, Field(ge=0), INTEGRAL] | None = Field(
        default=None, description="not supported: null only", json_schema_extra=_off(None)
    )
    suffix: str | None = Field(default=None, description="not supported: null only", json_schema_extra=_off(None))
    presence_penalty: float = Field(default=0.0, description="not supported: 0 only", json_schema_extra=_off(0))
    frequency_penalty: float = Field(default=0.0, description="not supported: 0 only", json_schema_extra=_off(0))
    logit_bias: dict[str, float] | None = Field(
        default=None, description="not supported: null only", json_schema_extra=_off(None)
    )
    user: str | None = Field(default=None, description="read and ignored")

    @model_validator(mode="after")
    def _supported(self) -> CompletionRequest:
        unsupported = {
            "echo": self.echo,
            "logprobs": self.logprobs is not None,
            "suffix": self.suffix is not None,
            "presence_penalty": self.presence_penalty != 0,
            "frequency_penalty": self.frequency_penalty != 0,
            "logit_bias": self.logit_bias is not None,
        }
        if asked := [name for name, on in unsupported.items() if on]:
            raise ValueError(f"{', '.join(asked)}: not supported by this server's completions")
        if self.best_of is not None and self.n > self.best_of:
            raise ValueError(f"n ({self.n}) must be at most best_of ({self.best_of})")
        if self.stream and (self.n > 1 or (self.draws > 1 and not self.use_beam_search)):
            raise ValueError("stream carries one output per prompt: n and best_of must be 1 (but for beam search)")
        return self

    @property
    def prompts(self) -> list[str]:
        return [self.prompt] if isinstance(self.prompt, str) else self.prompt

    @property
    def stops(self) -> list[str]:
        return [self.stop] if isinstance(self.stop, str) else list(self.stop or [])

    @property
    def draws(self) -> int:
        return self.best_of if self.best_of is not None else self.n

    @property
    def greedy(self) -> bool:
        return not self.use_beam_search and self.temperature == 0

    def options(self) -> dict[str, object]:
        """The task options this body asks for; what it leaves out stays the model's default. A
        greedy body's n outputs are its one output n times (as OpenAI's at temperature 0)."""
        out: dict[str, object] = {}
        if self.use_beam_search:
            out["decode"] = "beam"
            if self.best_of is not None:
                out["beam_size"] = self.best_of
            elif self.n > DEFAULT_BEAM_SIZE:  # the model's own width holds up to that many; wider, n beams
                out["beam_size"] = self.n
            if self.length_penalty is not None:
                out["length_penalty"] = self.length_penalty
            if self.n > 1:
                out["num_hypotheses"] = self.n
        elif self.greedy:
            out["decode"] = "greedy"
        else:
            out |= {"decode": "sample", "temperature": self.temperature, "top_p": self.top_p}
            out["top_k"] = max(self.top_k, 0)
            if self.seed is not None:
                out["seed"] = self.seed
            if self.draws > 1:
                out["num_hypotheses"] = self.draws
        for mine, theirs in (
            ("max_tokens", "max_new_tokens"),
            ("min_tokens", "min_new_tokens"),
            ("repetition_penalty", "repetition_penalty"),
        ):
            if (value := getattr(self, mine)) is not None:
                out[theirs] = value
        return out


class Choice(ResponseModel):
    index: int
    text: str
    finish_reason: Literal["stop", "length"] | None
    logprobs: None = None


class Usage(ResponseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class Completion(ResponseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[Choice]
    usage: Usage | None = None


def cut(text: str, stops: Sequence[str]) -> tuple[str, bool]:
    """`text` up to the first of `stops` it contains, and whether it held one."""
    at = min((i for i in (text.find(s) for s in stops) if i >= 0), default=-1)
    return (text[:at], True) if at >= 0 else (text, False)


class StopScan:
    """A streamed output's stop texts: what of each delta may be shown (never a stop's start, which
    the next delta could complete), and whether the output stopped."""

    def __init__(self, stops: Sequence[str]) -> None:
        self.stops, self.pending, self.stopped = list(stops), "", False

    def feed(self, delta: str) -> str:
        if self.stopped:
            return ""
        text, self.stopped = cut(self.pending + delta, self.stops)
        if self.stopped:
            self.pending = ""
            return text
        keep = max((k for s in self.stops for k in range(1, len(s)) if text.endswith(s[:k])), default=0)
        self.pending = text[len(text) - keep :] if keep else ""
        return text[: len(text) - keep]

    def flush(self) -> str:
        """The end of the output: what was held back is no stop after all."""
        rest, self.pending = ("" if self.stopped else self.pending), ""
        return rest


@dataclass(frozen=True)
class Pending:
    """The work, run when the answer is written: the answer needs the run's token counts (`Done`)."""

    work: Work


class CompletionsCodec(Codec[CompletionRequest, Any, Pending]):
    """`POST /v1/completions`: the body as the model's task options, the answer OpenAI's."""

    def __init__(self, rules: Mapping[str, str]) -> None:
        self.rules = rules

    async def decode(self, call: Call, settings: Settings) -> Decoded[CompletionRequest]:
        body = schemas.parse_json(call.body, CompletionRequest.model_validate, self.rules)
        schemas.check_texts(body.prompts, settings.max_texts, settings.max_text_chars, "prompt")
        return Decoded(body, body.prompts)

    def resolve(self, request: CompletionRequest, models: ModelSet) -> Task[Any, Any]:
        task = models.get(request.model).ready_task()
        if not isinstance(task, Seq2SeqTask):
            raise InvalidInput(
                f"model: {request.model!r} is a {task.name} model; completions need a translation or text2text model"
            )
        return task

    def work(self, request: CompletionRequest, task: Task[Any, Any], deadline: float) -> Work:
        try:
            options = task.Options.model_validate(request.options())
        except ValidationError as exc:
            raise InvalidInput(describe_validation(exc.errors(), self.rules)) from None
        return Work(request.prompts, options, deadline)

    def streams(self, request: CompletionRequest) -> bool:
        return request.stream

    async def execute(self, request: CompletionRequest, run: Run[Any], work: Work) -> Pending:
        return Pending(work)

    async def encode(self, request: CompletionRequest, task: Task[Any, Any], done: Pending) -> ASGIApp:
        assert isinstance(task, Seq2SeqTask)
        head = {"id": f"cmpl-{uuid.uuid4().hex}", "created": int(time.time()), "model": task.entry.name}
        if request.stream:
            return event_stream(_chunks(request, task, done.work, head), Protocol.OPENAI)
        return json_answer(completion(request, await task.answer(done.work), head))


def completion(request: CompletionRequest, done: Done, head: Mapping[str, Any]) -> Completion:
    """The whole answer: per prompt its `n` outputs (choice `prompt * n + j`; greedy: its one
    output n times), each cut at a stop text; usage counts every choice's tokens."""
    n, stops = request.n, request.stops
    choices, read, generated = [], 0, 0
    for i, row in enumerate(done.outputs):
        outputs = row[:1] * n if request.greedy else row[:n]
        for j, output in enumerate(outputs):
            text, stopped = cut(output.text, stops)
            reason = "stop" if stopped else FINISH[output.finish_reason]
            choices.append(Choice(index=i * n + j, text=text, finish_reason=reason))  # type: ignore[arg-type]
        r, g = usage(done, i, 1 if request.greedy else request.draws)  # every draw of best_of is generated
        read, generated = read + r, generated + (g * n if request.greedy else g)
    tokens = Usage(prompt_tokens=read, completion_tokens=generated, total_tokens=read + generated)
    return Completion(**head, choices=choices, usage=tokens)


async def _chunks(
    request: CompletionRequest, task: Seq2SeqTask[Any, Any], work: Work, head: Mapping[str, Any]
) -> AsyncGenerator[Mapping[str, object], None]:
    """The stream: a chunk per delta of each prompt's output, a last one per prompt with its
    finish_reason, and with `include_usage` a chunk with the usage and no choices (every chunk
    before it has `usage: null`, as OpenAI's)."""
    with_usage = request.stream_options is not None and request.stream_options.include_usage
    extra: dict[str, object] = {"object": "text_completion", **head} | ({"usage": None} if with_usage else {})
    scans = [StopScan(request.stops) for _ in work.texts]
    read = generated = 0

    def chunk(index: int, text: str, reason: str | None) -> dict[str, object]:
        return extra | {"choices": [{"index": index, "text": text, "finish_reason": reason, "logprobs": None}]}

    async with contextlib.aclosing(text_deltas(task, work)) as events:
        async for event in events:
            scan = scans[event.index]
            if isinstance(event, Delta):
                if shown := scan.feed(event.text):
                    yield chunk(event.index, shown, None)
                continue
            if rest := scan.flush():
                yield chunk(event.index, rest, None)
            yield chunk(event.index, "", "stop" if scan.stopped else FINISH[event.output.finish_reason])
            read, generated = read + event.source_tokens, generated + event.tokens
    if with_usage:
        usage_of = {"prompt_tokens": read, "completion_tokens": generated, "total_tokens": read + generated}
        yield extra | {"choices": [], "usage": usage_of}


EVENTS_DOC = """With "stream": true, Server-Sent Events as OpenAI's: `data: <text_completion chunk>` with
`choices[{index, text: <delta>, finish_reason: null}]` as a prompt's output grows, a chunk with its
`finish_reason` when it is complete, with `stream_options.include_usage` a last chunk with `usage` and
no choices, then `data: [DONE]`. An error after the first chunk is `data: {"error": {...}}`, then the
stream ends."""


def completions_doc(settings: Settings, served: Served) -> Mapping[str, Any]:
    """The body's prompt limits for these settings, and its `model`: a served sequence-to-sequence model."""
    prompt: dict[str, Any] = {
        "anyOf": [
            {"type": "string", "maxLength": settings.max_text_chars},
            {
                "type": "array",
                "minItems": 1,
                "maxItems": settings.max_texts,
                "items": {"type": "string", "maxLength": settings.max_text_chars},
            },
        ],
        "description": f"one text, or up to {settings.max_texts}: more, or a longer text, 422; a text over "
        "the model's tokens: 413",
    }
    kinds = {cls.name for cls in registry.tasks() if issubclass(cls, Seq2SeqTask)}
    mine = [(name, dict(limits)) for name, task, limits, _ in served if task in kinds]
    model: dict[str, Any] = {"type": "string", "description": "a served translator or text-to-text model"}
    fields: dict[str, Any] = {"prompt": prompt, "model": model}
    if mine:
        model["enum"] = [name for name, _ in mine]
        most = max(limits.get("max_new_tokens", MAX_NEW_TOKENS) for _, limits in mine)
        fields["max_tokens"] = {"anyOf": [{"type": "integer", "minimum": 1, "maximum": most}, {"type": "null"}]}
    ref = {"$ref": "#/components/schemas/CompletionRequest"}
    body = {"allOf": [ref, {"properties": fields}]}
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": body}}}}


def routes(rules: Mapping[str, str]) -> list[Route]:
    return [
        Route(
            "/v1/completions",
            ("POST",),
            CompletionsCodec(rules),
            "completions",
            protocol=Protocol.OPENAI,
            summary="OpenAI-compatible completions on a translator or text-to-text model",
            description=__doc__.split("\n\n")[1],
            body=CompletionRequest,
            response=Completion,
            events=EVENTS_DOC,
            auth=Auth.BEARER,
            errors=TASK_ERRORS,
            metric="/v1/completions",
            doc_served=completions_doc,
        )
    ]
