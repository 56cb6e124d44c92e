"""`create_app(settings)`: wiring only. The lifespan loads, verifies and warms up the models in the
background, so /healthz answers at once and /readyz turns 200 only when every model is warm; on
shutdown the tasks finish admitted work (up to SERVE_DRAIN_TIMEOUT_S).

Every route is declared once in the route table (`service.http.table`): REST, the Open Inference
Protocol, the LibreTranslate API, the page and the API document's own routes. A request goes
router -> request context -> API keys -> client rate (when limits are set) -> body limit -> the
route's handler (`service.http.dispatch`); FastAPI stays the application (lifespan, state, the
documentation pages), not the router.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import time
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor

from fastapi import FastAPI
from starlette.types import ASGIApp, Receive, Scope, Send

from service import priority, tracing
from service.http import apidocs, files, libretranslate, oip, openai, openapi, page, pairs, rest
from service.http.auth import ApiKeys, KeyRing
from service.http.dispatch import Endpoint, Router
from service.http.downloads import Downloads
from service.http.limits import ClientLimits, Limits, PolicySource
from service.http.middleware import BodyLimit, ClientRate, RequestContext
from service.http.schemas import OipInferRequest
from service.http.state import AppState
from service.http.table import RouteTable
from service.metrics import Metrics
from service.priority import lower_priority
from service.serving import ModelSet, freeze_heap
from service.settings import Settings
from service.tasks import registry
from service.tasks.pairs import RerankRequest, ZeroShotRequest
from service.validation import field_rules

log = logging.getLogger(__name__)


class ServiceApp(FastAPI):
    """FastAPI as the application (lifespan, state), with the route table's one request path as
    its whole stack: none of FastAPI's own routing or middleware runs for a request."""

    table: RouteTable

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        # not FastAPI's: its per-request OpenTelemetry check alone cost about 5 % of a /predict's CPU
        if scope["type"] == "lifespan":
            await super().__call__(scope, receive, send)
            return
        scope["app"] = self
        if self.middleware_stack is None:
            self.middleware_stack = self.build_middleware_stack()
        await self.middleware_stack(scope, receive, send)

    def build_middleware_stack(self) -> ASGIApp:
        s = self.state.serve.settings
        app: ASGIApp = Endpoint(lifespan=self.router)
        app = BodyLimit(app, s.max_body_bytes, s.body_timeout_s, s.max_file_bytes)
        if self.state.serve.limits.active:
            app = ClientRate(app, self.state.serve.limits, s.limit_hold_s)
        app = ApiKeys(app, self.state.serve.keys, self.state.serve.metrics)
        app = RequestContext(app, metrics=self.state.serve.metrics, max_in_flight=s.max_in_flight)
        return Router(app, self.table)


def create_app(settings: Settings) -> ServiceApp:
    metrics = Metrics()
    priority.use(settings.model_thread_priority)
    # One thread loads and warms up the models (one at a time, so loading never takes every core
    # from serving); each task then runs its model work on threads of its own. It runs below the
    # event loop like them, and so do ONNX Runtime's worker threads: they inherit its priority.
    executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="model", initializer=lower_priority)
    models = ModelSet(settings, metrics, executor)
    downloads = Downloads(settings.download_ttl_s)
    state = AppState(settings, metrics, models, KeyRing.of(settings), client_limits(settings, metrics), downloads)
    state.tracing = tracing.start(metrics)  # None unless the OTEL_* variables name a collector
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
            drain_end = time.monotonic() + settings.drain_timeout_s
            await state.models.close(settings.drain_timeout_s)
            if state.tracing is not None:  # the spans queued so far, within what is left of the drain
                await state.tracing.close(max(tracing.MIN_FLUSH_S, min(tracing.FLUSH_S, drain_end - time.monotonic())))
            executor.shutdown(wait=False, cancel_futures=True)
            downloads.close()
            gc.unfreeze()  # the models closed: their objects may be collected like any other

    app = ServiceApp(
        title=openapi.TITLE,
        lifespan=lifespan,
        docs_url=None,
        redoc_url=None,
        openapi_url=None,  # the table declares the document and its pages
        telemetry={"tracing": False, "metrics": False, "logs": False},
    )
    app.state.serve = state
    rules = field_rules(
        *(cls.Request for cls in tasks), OipInferRequest, RerankRequest, ZeroShotRequest, openai.CompletionRequest
    )
    api = [*rest.routes(tasks, rules), *pairs.routes(rules), *files.routes(), *oip.routes(), *openai.routes(rules)]
    api += [*libretranslate.routes(), *page.routes()]
    document = openapi.builder(tuple(api), settings, state.models)
    app.table = RouteTable([*api, *openapi.routes(document), *apidocs.routes(openapi.TITLE, settings.api_pages)])
    app.openapi = document  # type: ignore[method-assign]
    return app


def client_limits(settings: Settings, metrics: Metrics) -> ClientLimits:
    """Per-client limits from the settings (and the limits file, read now: a broken one stops the start)."""
    base = Limits(settings.client_requests_per_minute, settings.client_chars_per_minute, settings.max_request_chars)
    refused = metrics.client_limited
    return ClientLimits(
        PolicySource(base, settings.limits_file),
        settings.trusted_proxy_header,
        refused=lambda limit: refused.labels(limit).inc(),
    )


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
