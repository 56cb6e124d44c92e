"""What the routes share: settings, metrics, the served models, the files kept for download and
the draining flag."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from starlette.types import Scope

from service.http.auth import KeyRing
from service.http.downloads import Downloads
from service.http.limits import ClientLimits
from service.metrics import Metrics
from service.serving import ModelSet
from service.settings import Settings
from service.tracing import Tracing


@dataclass
class AppState:
    settings: Settings
    metrics: Metrics
    models: ModelSet
    keys: KeyRing
    limits: ClientLimits  # per-client limits (none unless set)
    downloads: Downloads  # translated files for LibreTranslate's download URL
    draining: bool = False  # set on SIGTERM: /readyz answers 503; requests are still served
    closing: bool = False  # set when the listener closes after the grace: new requests answer 503
    watcher: asyncio.Task[None] | None = None  # the store watcher, when SERVE_WATCH_INTERVAL_S > 0
    tracing: Tracing | None = None  # OpenTelemetry traces, when the OTEL_* variables name a collector

    @property
    def ready(self) -> bool:
        return not self.draining and self.models.snapshot().ready

    def not_ready_reason(self) -> str:
        if self.draining:
            return "the service is shutting down"
        return "not ready: " + "; ".join(self.models.snapshot().reasons or ["starting"])


def scope_state(scope: Scope) -> AppState:
    state = scope["app"].state.serve
    assert isinstance(state, AppState)
    return state
