"""The REST API's routes: health, readiness, metrics, the model list, and one POST route per task.

HTTP in, HTTP out: a task route parses the body with the task's own request model, resolves the
model, decodes the body into the task's neutral `Work` (`Task.rest_work`), runs it, and encodes
the result (`Task.rest_answer`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from starlette.responses import Response
from starlette.types import ASGIApp

from service.errors import NotReady, ShuttingDown
from service.http import schemas
from service.http.dispatch import Call, json_answer
from service.http.table import Auth, Handler, Route
from service.metrics import CONTENT_TYPE
from service.serving import VersionView
from service.tasks.base import Task


async def healthz(call: Call) -> ASGIApp:
    """Alive: the process answers (models may still be loading)."""
    return json_answer({"status": "ok"})


async def readyz(call: Call) -> ASGIApp:
    """200 only when every model is loaded and warmed up and the service is not shutting down; lists the
    models served (not those unloaded)."""
    state = call.state
    if state.draining:
        raise ShuttingDown(state.not_ready_reason())
    snapshot = state.models.snapshot()
    if not snapshot.ready:
        raise NotReady(state.not_ready_reason())
    return json_answer({"status": "ready", "models": sorted({v.name for v in snapshot.serving()})})


async def metrics(call: Call) -> ASGIApp:
    return Response(call.state.metrics.render(), media_type=CONTENT_TYPE)


def model_info(v: VersionView) -> schemas.ModelInfo:
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
    return schemas.ModelInfo.model_validate(info)


async def list_models(call: Call) -> ASGIApp:
    """Every loaded version of every model (`current`: the one requests without a version get), and
    the versions refused (files that do not match their manifest, or a failed load)."""
    snapshot = call.state.models.snapshot()
    return json_answer(schemas.ModelsResponse(models=[model_info(v) for v in snapshot.versions]))


def task_handler(cls: type[Task], rules: Mapping[str, str]) -> Handler:
    async def handle(call: Call) -> ASGIApp:
        body = call.parse(cls.Request, rules)
        state, deadline = call.admit()
        s = state.settings
        schemas.check_texts(body.texts, s.max_texts, s.max_text_chars)
        call.charge(body.texts)
        task = state.models.resolve(body.model, cls.name, body.version)
        call.info.model = task.entry.name
        result = await task.run(cls.rest_work(body, deadline))
        return json_answer(task.rest_answer(body, result))

    return handle


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
                task_handler(cls, rules),
                cls.name,
                summary=cls.summary,
                body=cls.Request,
                response=cls.Response,
                auth=Auth.BEARER,
                errors=TASK_ERRORS,
                metric=cls.rest_path,
            )
        )
    return out
