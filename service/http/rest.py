"""The REST API's routes: health, readiness, metrics, the model list, and one POST route per task.

HTTP in, HTTP out: a task route is the pipeline (`service.http.pipeline`) with the REST codec of
its task (`RestCodec`): the body as the task's own request model, the task's neutral `Work`
(`Task.rest_work`), the result as the task's response (`Task.rest_answer`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Generic, TypeVar

from starlette.responses import Response
from starlette.types import ASGIApp

from service.errors import BadRequest, NotReady, ShuttingDown
from service.http import schemas
from service.http.dispatch import json_answer
from service.http.events import event_stream
from service.http.pipeline import Codec, Decoded, Run
from service.http.scope import Call
from service.http.state import scope_state
from service.http.table import Auth, Protocol, Route
from service.metrics import CONTENT_TYPE
from service.serving import ModelSet, VersionView
from service.settings import Settings
from service.tasks.base import Task, TextsRequest, Work

Q = TypeVar("Q", bound=TextsRequest)
R = TypeVar("R")


async def healthz(call: Call) -> ASGIApp:
    """Alive: the process answers (models may still be loading)."""
    return json_answer({"status": "ok"})


async def readyz(call: Call) -> ASGIApp:
    """200 only when every model is loaded and warmed up and the service is not shutting down; lists the
    models served (not those unloaded)."""
    state = scope_state(call.scope)
    if state.draining:
        raise ShuttingDown(state.not_ready_reason())
    snapshot = state.models.snapshot()
    if not snapshot.ready:
        raise NotReady(state.not_ready_reason())
    return json_answer({"status": "ready", "models": sorted({v.name for v in snapshot.serving()})})


async def metrics(call: Call) -> ASGIApp:
    """Prometheus text, or OpenMetrics (with exemplars) for a scraper whose Accept asks for it."""
    accept = next((v.decode("latin-1") for k, v in call.scope.get("headers", ()) if k == b"accept"), "")
    body, media_type = scope_state(call.scope).metrics.exposition(accept)
    return Response(body, media_type=media_type)


def model_info(v: VersionView) -> schemas.ModelInfo:
    info: dict[str, object] = {
        "id": v.name,
        "name": v.name,
        "version": v.version,
        "task": v.task_name if v.held else None,
        "status": v.state.value,
        "current": v.current if v.held else None,
        "error": v.error,
    }
    if v.task is not None:
        info |= {"variant": v.task.variant, "created": published(v.task.manifest.created), **v.task.describe()}
        info["figures"] = sorted(v.task.manifest.figures) or None
    return schemas.ModelInfo.model_validate(info)


async def list_models(call: Call) -> ASGIApp:
    """Every loaded version of every model (`current`: the one requests without a version get), and
    the versions refused (files that do not match their manifest, or a failed load), in OpenAI's
    list shape: `{"object": "list", "data": [...]}`, each entry a model object with its `id`."""
    snapshot = scope_state(call.scope).models.snapshot()
    return json_answer(schemas.ModelsResponse(data=[model_info(v) for v in snapshot.versions]))


def published(created: str) -> int:
    """A manifest's `created` (ISO 8601) as Unix time; 0 when it does not read as one."""
    try:
        stamp = datetime.fromisoformat(created)
    except ValueError:
        return 0
    return int((stamp if stamp.tzinfo else stamp.replace(tzinfo=UTC)).timestamp())


@dataclass(frozen=True)
class Streamed:
    """A run that becomes the answer's stream: the work, not yet run."""

    work: Work


class RestCodec(Codec[Q, R, "R | Streamed"], Generic[Q, R]):
    """A task's native REST API: its `Request` body in, its `Response` out; with `"stream": true`,
    its events (`service.http.events`): the run is the stream, after every check of the pipeline."""

    def __init__(self, cls: type[Task[Q, R]], rules: Mapping[str, str]) -> None:
        self.cls, self.rules = cls, rules

    async def decode(self, call: Call, settings: Settings) -> Decoded[Q]:
        body = schemas.parse_json(call.body, self.cls.rest_request, self.rules)
        schemas.check_texts(body.inputs, settings.max_texts, settings.max_text_chars, listed=body.listed)
        if body.streamed and (conflicts := body.stream_conflicts()):
            raise BadRequest(f"stream cannot be combined with {' or '.join(conflicts)}")
        return Decoded(body, body.inputs, body.timeout_s)

    def resolve(self, request: Q, models: ModelSet) -> Task[Q, R]:
        return models.resolve(request.model, self.cls.name, request.version)  # a model of this task, or 422

    def work(self, request: Q, task: Task[Any, R], deadline: float) -> Work:
        return self.cls.rest_work(request, deadline)

    def streams(self, request: Q) -> bool:
        return request.streamed

    async def execute(self, request: Q, run: Run[R], work: Work) -> R | Streamed:
        return Streamed(work) if request.streamed else await run(work)

    async def encode(self, request: Q, task: Task[Any, R], done: R | Streamed) -> ASGIApp:
        if isinstance(done, Streamed):
            return event_stream(task.rest_events(request, done.work), Protocol.REST)
        return json_answer(task.rest_answer(request, done))


TASK_ERRORS = (404, 413, 422, 429, 503, 504)


def routes(tasks: Iterable[type[Task]], rules: Mapping[str, str]) -> list[Route]:
    out = [
        Route("/healthz", ("GET",), healthz, "healthz", summary="Alive", probe=True),
        Route("/readyz", ("GET",), readyz, "readyz", summary="Ready", probe=True, errors=(503,)),
        Route(
            "/metrics",
            ("GET",),
            metrics,
            "metrics",
            summary="Prometheus metrics",
            probe=True,
            media_type=CONTENT_TYPE,
            auth=Auth.METRICS,
        ),
        Route(
            "/v1/models",
            ("GET",),
            list_models,
            "list_models",
            summary="List models",
            description=list_models.__doc__ or "",
            response=schemas.ModelsResponse,
        ),
    ]
    for cls in tasks:
        out.append(
            Route(
                cls.rest_path,
                ("POST",),
                RestCodec(cls, rules),
                cls.name,
                summary=cls.summary,
                body=cls.Request,
                response=cls.Response,
                events=cls.rest_events_doc,
                auth=Auth.BEARER,
                errors=TASK_ERRORS,
                metric=cls.rest_path,
            )
        )
    return out
