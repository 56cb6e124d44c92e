"""The protocol every served task implements, so that nothing outside `service/tasks/` asks
"classifier or translator?".

A task object is one loaded model version of one task. It owns its typed request options
(`Options`), how its work is queued and run (`run`: a protocol-neutral `Work` in, the task's own
result out), and its metadata for `/v1/models` and the Open Inference Protocol. A task is typed by
its REST body and its result (`Task[Q, R]`): the protocols' codecs (`service.http.pipeline`) are
typed against them, so no codec has to ask what a result is. What only the task can say of its
protocols is declared here: its native REST body and answer (`Request`/`Response`, read by
`rest_request`, answered by `rest_answer`) and its Open Inference Protocol outputs
(`outputs`/`tensors`). `tasks.registry` maps a manifest's `task` to the class.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Annotated, Any, ClassVar, Generic, TypeVar, cast

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, model_validator

from service.contract.manifest import LANGUAGE_CODE_PATTERN, MAX_MODEL_NAME, MODEL_NAME_PATTERN
from service.engine.runtime import LoadOptions
from service.errors import BadRequest
from service.metrics import BatchMetrics
from service.settings import Settings
from service.store import StoreEntry
from service.tracing import Trace

ModelName = Annotated[str, Field(min_length=1, max_length=MAX_MODEL_NAME, pattern=MODEL_NAME_PATTERN)]
LanguageCode = Annotated[str, Field(min_length=2, max_length=32, pattern=LANGUAGE_CODE_PATTERN)]


def _integral(value: object) -> object:
    """JSON has one number type: 4.0 is the integer 4 (as the API document's "integer" says); a
    string stays a string, which strict validation then refuses."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


INTEGRAL = BeforeValidator(_integral)
Int = Annotated[int, INTEGRAL]
"""An integer request field: a whole JSON number, whatever way it is written. An optional one
puts its bounds before INTEGRAL (`Annotated[int, Field(ge=1), INTEGRAL] | None`), or the API
document loses them."""


ONE_TEXT_FOR_ATTENTION: dict[str, Any] = {
    "if": {"properties": {"return_attention": {"const": True}}, "required": ["return_attention"]},
    "then": {"properties": {"texts": {"maxItems": 1}}},
}
"""The API document's form of the rule "return_attention takes one text per request"."""


class StrictModel(BaseModel):
    """Request bodies: no type coercion, no unknown fields, no NaN/Infinity."""

    model_config = ConfigDict(strict=True, extra="forbid", allow_inf_nan=False)


class ResponseModel(BaseModel):
    model_config = ConfigDict(extra="forbid")


class TextsRequest(StrictModel):
    """Every task's REST body: a list of texts and, optionally, which model."""

    texts: list[str] = Field(min_length=1, description="input texts; answers come back in the same order")
    model: ModelName | None = Field(default=None, description="model name; default: the only (or default) one")
    version: Annotated[int, Field(ge=1), INTEGRAL] | None = Field(
        default=None, description="model version; default: the one serving"
    )

    @property
    def timeout_s(self) -> float | None:
        """The request's own deadline option, if its body has one: it only shortens the server's."""
        return None

    @property
    def inputs(self) -> Sequence[str]:
        """Every text the model reads for the request: what its client is charged for."""
        return self.texts

    @property
    def listed(self) -> tuple[str, int]:
        """The field of the inputs the request lists and how many, counted against SERVE_MAX_TEXTS:
        a text, or a pair of texts, is one (as a rerank's document and an OIP text/text_pair row)."""
        return "texts", len(self.texts)

    @property
    def streamed(self) -> bool:
        """The answer is asked for as a stream of events (a task whose body has `stream`)."""
        return False

    def stream_conflicts(self) -> list[str]:
        """The options set that a stream cannot carry (refused with `stream`)."""
        return []


class AttentionRequest(TextsRequest):
    """A REST body that may ask for the model's attention, which is drawn for one text only."""

    model_config = TextsRequest.model_config | {"json_schema_extra": {"allOf": [ONE_TEXT_FOR_ATTENTION]}}

    return_attention: bool = Field(default=False, description="the attention maps (one text per request)")

    @model_validator(mode="after")
    def _one_text_for_attention(self) -> AttentionRequest:
        if self.return_attention and len(self.texts) != 1:
            raise ValueError("return_attention takes one text per request")
        return self


@dataclass(frozen=True)
class Work:
    """A protocol-neutral request: what every protocol's codec decodes into."""

    texts: Sequence[str]
    options: BaseModel  # an instance of the task's `Options`
    deadline: float  # time.monotonic() by which the answer is due
    attention: bool = False  # also the attention maps (one text)
    pairs: Sequence[tuple[str, str]] = ()  # a pair classifier's inputs instead of texts (`texts` empty)
    trace: Trace | None = None  # the request's span when it is traced: the run adds its parts as children


@dataclass(frozen=True)
class TensorSpec:
    """An Open Inference Protocol output as model metadata describes it (-1: any size)."""

    name: str
    datatype: str  # "BYTES", "FP32", "INT64", ...
    shape: list[int]


@dataclass(frozen=True)
class OutputTensor:
    name: str
    datatype: str
    shape: list[int]
    data: list[Any]  # row-major, flat


@dataclass(frozen=True)
class TaskContext:
    """What a task gets from the service: its settings and metrics. A task runs its model work on
    its own worker thread(s), so tasks never wait for each other."""

    settings: Settings
    metrics: BatchMetrics


Q = TypeVar("Q", bound=TextsRequest)  # a task's REST body
R = TypeVar("R")  # a task's result


class Task(ABC, Generic[Q, R]):
    name: ClassVar[str]  # the manifest's `task`
    rest_path: ClassVar[str]  # POST route of the REST API, e.g. "/predict"
    summary: ClassVar[str]  # one line for the API document
    default_setting: ClassVar[str]  # the Settings field that names this task's default model
    threads_setting: ClassVar[str] = ""  # the Settings field with its thread count (0 or none: automatic)
    cpu_share: ClassVar[float | None] = None  # automatic thread count: this share of all; None: what is left
    Options: ClassVar[type[StrictModel]]  # per-request options, whatever the protocol
    Request: ClassVar[type[TextsRequest]]  # the REST body: texts, model, version and the options
    Response: ClassVar[type[BaseModel]]  # the REST answer
    rest_events_doc: ClassVar[str] = ""  # a REST body with `stream`: its events, for the API document

    def __init__(self, entry: StoreEntry, variant: str) -> None:
        self.entry, self.variant = entry, variant
        self.manifest = entry.require_manifest()
        # figure name -> PNG bytes, read and checked against the manifest when the version loaded
        self.figures: dict[str, bytes] = {}

    @classmethod
    @abstractmethod
    def load(cls, entry: StoreEntry, options: LoadOptions, context: TaskContext) -> Task:
        """Builds and warms up the model (blocking: runs in the worker thread)."""

    @abstractmethod
    def start(self) -> None:
        """Starts the task's queue on the running event loop; it serves from then on."""

    @abstractmethod
    async def close(self, timeout: float) -> None:
        """Stops admitting; admitted work finishes for up to `timeout` s; the rest fails."""

    @property
    @abstractmethod
    def in_flight(self) -> int:
        """Items admitted and not yet answered."""

    @abstractmethod
    def describe(self) -> Mapping[str, object]:
        """Extra `/v1/models` fields (labels, limits, languages)."""

    @abstractmethod
    def outputs(self) -> list[TensorSpec]:
        """The Open Inference Protocol outputs of `infer`, in order."""

    @abstractmethod
    async def run(self, work: Work) -> R:
        """The work's result, in the task's own terms (no protocol's shape); with `work.trace`, its
        parts (queue, batches, decoder steps) become children of the request's span."""

    @abstractmethod
    def tensors(self, result: R) -> list[OutputTensor]:
        """A result as every output of `outputs()`, in order."""

    @classmethod
    def rest_request(cls, data: object) -> Q:
        """The REST body, validated as `Request` (pydantic's ValidationError for a bad one): the
        `Q` of `Task[Q, R]`, which a ClassVar cannot be typed as."""
        return cast(Q, cls.Request.model_validate(data))

    @classmethod
    def rest_work(cls, body: Q, deadline: float) -> Work:
        """The REST body's work: its texts and options (`Request` extends `Options`)."""
        return Work(body.texts, body, deadline, attention=isinstance(body, AttentionRequest) and body.return_attention)

    @abstractmethod
    def rest_answer(self, body: Q, result: R) -> BaseModel:
        """A result as the `Response` to `body`."""

    def rest_events(self, body: Q, work: Work) -> AsyncIterator[Mapping[str, object]]:
        """The REST answer as events, for a body that asks for a stream (`streamed`): refused
        now (busy, bad input) or at its first event, never after it but as an error event."""
        raise BadRequest(f"{self.name} answers whole: stream is not an option of {self.rest_path}")
