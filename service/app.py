"""`create_app(settings)`: wiring only. The lifespan loads, verifies and warms up the models in the
background, so /healthz answers at once and /readyz turns 200 only when every model is warm; on
shutdown the tasks finish admitted work (up to SERVE_DRAIN_TIMEOUT_S).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor

from fastapi import FastAPI
from fastapi.routing import APIRoute
from starlette.middleware import Middleware
from starlette.types import ASGIApp

from service import priority
from service.http import errors, libretranslate, oip, openapi, page, routes
from service.http.auth import ApiKeys
from service.http.direct import DirectTaskRoutes
from service.http.middleware import BodyLimit, RequestContext
from service.http.schemas import OipInferRequest
from service.http.state import AppState
from service.metrics import Metrics
from service.priority import lower_priority
from service.serving import ModelSet, freeze_heap
from service.settings import Settings
from service.tasks import registry
from service.validation import field_rules

log = logging.getLogger(__name__)


class ServiceApp(FastAPI):
    """FastAPI with the service's own middleware (`outer_middleware`, outermost first) around its
    whole stack: request context, API keys, body limit and the direct task path run before
    FastAPI's error, telemetry and body-limit layers, so a task request the direct path answers
    never enters them (they cost the event loop more than its routing; py-spy). An exception
    nothing handled becomes `RequestContext`'s one 500 answer."""

    outer_middleware: list[Middleware]

    def build_middleware_stack(self) -> ASGIApp:
        app = super().build_middleware_stack()
        for cls, args, kwargs in reversed(self.outer_middleware):
            app = cls(app, *args, **kwargs)
        return app


def create_app(settings: Settings) -> ServiceApp:
    metrics = Metrics()
    priority.use(settings.model_thread_priority)
    # One thread loads and warms up the models (one at a time, so loading never takes every core
    # from serving); each task then runs its model work on threads of its own. It runs below the
    # event loop like them, and so do ONNX Runtime's worker threads: they inherit its priority.
    executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="model", initializer=lower_priority)
    state = AppState(settings, metrics, ModelSet(settings, metrics, executor))
    tasks = registry.tasks()

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        loader = asyncio.create_task(start_models(state), name="load-models")
        try:
            yield
        finally:
            state.draining = True
            for task in (loader, state.watcher):
                if task is not None and not task.done():
                    task.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await task
            await state.models.close(settings.drain_timeout_s)
            executor.shutdown(wait=False, cancel_futures=True)
            gc.unfreeze()  # the models closed: their objects may be collected like any other

    otel = settings.opentelemetry  # off by default: Prometheus has the figures, and FastAPI's
    # per-request check for an OpenTelemetry provider cost about 8 % of a small request (py-spy)
    app = ServiceApp(
        title="transformer-serve",
        summary="Transformer text models (classification, translation) over ONNX Runtime",
        lifespan=lifespan,
        telemetry={"tracing": otel, "metrics": otel, "logs": otel},
    )
    app.state.serve = state
    rules = field_rules(*(cls.Request for cls in tasks), OipInferRequest)
    errors.install(app, rules)
    openapi.install(app, settings, state.models)
    routers = [routes.router, routes.task_router(tasks), oip.router, libretranslate.router, page.router]
    for router in routers:
        app.include_router(router)
    post_routes = [
        r.path_regex
        for router in routers
        for r in router.routes
        if isinstance(r, APIRoute) and "POST" in (r.methods or ())
    ]
    task_paths = frozenset(cls.rest_path for cls in tasks)
    app.outer_middleware = [
        Middleware(
            RequestContext,
            metrics=metrics,
            endpoints=task_paths | {"/libretranslate/translate"},
            max_in_flight=settings.max_in_flight,
        ),
        Middleware(ApiKeys, keys=settings.api_key_list, task_paths=task_paths),
        Middleware(
            BodyLimit,
            max_bytes=settings.max_body_bytes,
            accepts_body=lambda path: any(rx.match(path) for rx in post_routes),
            body_timeout=settings.body_timeout_s,
        ),
        Middleware(DirectTaskRoutes, tasks=tasks, rules=rules),
    ]
    return app


async def start_models(state: AppState) -> None:
    """Verify, load and warm up every model in the worker thread, then start their queues."""
    models = state.models
    try:
        await asyncio.get_running_loop().run_in_executor(models.executor, models.load)
        models.start()
        freeze_heap()
    except Exception:
        log.exception("loading the models failed")
        models.fail("loading the models failed (see the log)")
        return
    snapshot = models.snapshot()
    if snapshot.ready:
        log.info("ready: serving %s", ", ".join(f"{v.name}/{v.version}" for v in snapshot.serving()))
    else:
        log.error("not ready: %s", "; ".join(snapshot.reasons))
    interval = state.settings.watch_interval_s
    if interval > 0:
        state.watcher = asyncio.create_task(models.watch(interval), name="store-watcher")
        log.info("watching %s for new versions every %.1f s", state.settings.model_store, interval)
