"""The protocol every served task implements, so that nothing outside `service/tasks/` asks
"classifier or translator?".

A task object is one loaded model version of one task. It owns its request options and their
validation against the model, how its work is queued and run, how results become answers, and
its metadata for `/v1/models` and the Open Inference Protocol. The HTTP layer only parses,
calls `answer` (REST) or `infer` (OIP), and shapes what comes back; `tasks.registry` maps a
manifest's `task` to the class.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Annotated, Any, ClassVar

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field

from service.engine.runtime import LoadOptions
from service.metrics import BatchMetrics
from service.settings import Settings
from service.store import StoreEntry

ModelName = Annotated[str, Field(min_length=1, max_length=128, pattern=r"^[a-z0-9][a-z0-9._-]*$")]


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


class Task(ABC):
    name: ClassVar[str]  # the manifest's `task`
    rest_path: ClassVar[str]  # POST route of the REST API, e.g. "/predict"
    summary: ClassVar[str]  # one line for the API document
    default_setting: ClassVar[str]  # the Settings field that names this task's default model
    threads_setting: ClassVar[str] = ""  # the Settings field with its thread count (0 or none: automatic)
    cpu_share: ClassVar[float | None] = None  # automatic thread count: this share of all; None: what is left
    Request: ClassVar[type[TextsRequest]]
    Response: ClassVar[type[BaseModel]]

    def __init__(self, entry: StoreEntry, variant: str) -> None:
        self.entry, self.variant = entry, variant
        self.manifest = entry.require_manifest()

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
    async def answer(self, body: TextsRequest, deadline: float) -> BaseModel:
        """The REST answer to a validated `Request` body."""

    @abstractmethod
    async def infer(self, texts: list[str], parameters: Mapping[str, Any], deadline: float) -> list[OutputTensor]:
        """Every output of `outputs()` for the texts; `parameters` are the request's, unvalidated."""
