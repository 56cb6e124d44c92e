"""REST endpoints: health, readiness, metrics, the model list, and one POST route per task.

HTTP in, HTTP out: a task route validates the body with the task's own request model, resolves
the model, and returns the task's answer (`answer_task`). Under a server, POSTs to the task routes
are answered by `service.http.direct` before routing, through the same `answer_task`; the routes
here give the API document its operations and answer when the app runs without that middleware.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable

from fastapi import APIRouter, Request
from pydantic import BaseModel
from starlette.responses import Response
from starlette.types import Scope

from service.errors import NotReady, ShuttingDown
from service.http import schemas
from service.http.middleware import request_info
from service.http.state import admit_scope, get_state
from service.metrics import CONTENT_TYPE
from service.tasks.base import Task, TextsRequest

ERRORS: dict[int | str, dict[str, object]] = {
    code: {"model": schemas.ErrorResponse, "description": what}
    for code, what in (
        (404, "unknown model"),
        (413, "body, text or token count above its limit"),
        (422, "invalid field (the message names it and its allowed range)"),
        (429, "queue full (see Retry-After)"),
        (503, "not ready or shutting down"),
        (504, "deadline passed"),
    )
}

router = APIRouter()


@router.get("/healthz")
async def healthz() -> dict[str, str]:
    """Alive: the process answers (models may still be loading)."""
    return {"status": "ok"}


@router.get("/readyz", responses={503: {"model": schemas.ErrorResponse}})
async def readyz(request: Request) -> dict[str, object]:
    """200 only when every model is loaded and warmed up and the service is not shutting down."""
    state = get_state(request)
    if state.draining:
        raise ShuttingDown(state.not_ready_reason())
    if not state.ready:
        raise NotReady(state.not_ready_reason())
    return {"status": "ready", "models": sorted({v.name for v in state.models.snapshot().versions})}


@router.get("/metrics", response_class=Response)
async def metrics(request: Request) -> Response:
    return Response(get_state(request).metrics.render(), media_type=CONTENT_TYPE)


@router.get("/v1/models", response_model=schemas.ModelsResponse, response_model_exclude_none=True)
async def list_models(request: Request) -> schemas.ModelsResponse:
    """Every loaded version of every model (`current`: the one requests without a version get), and
    the versions refused (files that do not match their manifest, or a failed load)."""
    out = []
    for v in get_state(request).models.snapshot().versions:
        info: dict[str, object] = {
            "name": v.name,
            "version": v.version,
            "task": v.task_name if v.held else None,
            "status": v.state.value,
            "current": v.current if v.held else None,
            "error": v.error,
        }
        if v.task is not None:
            info |= {"variant": v.task.variant, **v.task.describe()}
            info["figures"] = sorted(v.task.manifest.figures) or None
        out.append(schemas.ModelInfo.model_validate(info))
    return schemas.ModelsResponse(models=out)


def task_router(tasks: Iterable[type[Task]]) -> APIRouter:
    """One POST route per task, typed with the task's own request and response models."""
    out = APIRouter()
    for cls in tasks:
        out.add_api_route(
            cls.rest_path,
            _endpoint(cls),
            methods=["POST"],
            response_model=cls.Response,
            response_model_exclude_none=True,
            responses=ERRORS,
            summary=cls.summary,
            name=cls.name,
            strict_content_type=False,  # a body without Content-Type is read as JSON (`BodyLimit`)
        )
    return out


async def answer_task(cls: type[Task], scope: Scope, body: TextsRequest) -> BaseModel:
    """A validated task request's answer: size limits, the model it names, the task's `answer`."""
    state, deadline = admit_scope(scope)
    s = state.settings
    schemas.check_texts(body.texts, s.max_texts, s.max_text_chars)
    task = state.models.resolve(body.model, cls.name, body.version)
    request_info(scope).model = task.entry.name
    return await task.answer(body, deadline)


def _endpoint(cls: type[Task]) -> Callable[[TextsRequest, Request], Awaitable[BaseModel]]:
    async def endpoint(body: TextsRequest, request: Request) -> BaseModel:
        return await answer_task(cls, request.scope, body)

    endpoint.__annotations__ = {"body": cls.Request, "request": Request, "return": BaseModel}
    return endpoint
