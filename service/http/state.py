"""What the routes share: settings, metrics, the served models and the draining flag."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from fastapi import Request
from starlette.types import Scope

from service.errors import ShuttingDown
from service.http.middleware import request_info
from service.metrics import Metrics
from service.serving import ModelSet
from service.settings import Settings


@dataclass
class AppState:
    settings: Settings
    metrics: Metrics
    models: ModelSet
    draining: bool = False  # set on shutdown (SIGTERM): /readyz and new requests answer 503
    watcher: asyncio.Task[None] | None = None  # the store watcher, when SERVE_WATCH_INTERVAL_S > 0

    @property
    def ready(self) -> bool:
        return not self.draining and self.models.snapshot().ready

    def not_ready_reason(self) -> str:
        if self.draining:
            return "the service is shutting down"
        return "not ready: " + "; ".join(self.models.snapshot().reasons or ["starting"])


def get_state(request: Request) -> AppState:
    return scope_state(request.scope)


def scope_state(scope: Scope) -> AppState:
    state = scope["app"].state.serve
    assert isinstance(state, AppState)
    return state


def admit(request: Request) -> tuple[AppState, float]:
    """The app state and this request's deadline; 503 while draining."""
    return admit_scope(request.scope)


def admit_scope(scope: Scope) -> tuple[AppState, float]:
    state = scope_state(scope)
    if state.draining:
        raise ShuttingDown("the service is shutting down; retry on another instance")
    return state, request_info(scope).start + state.settings.request_timeout_s


def set_model(request: Request, name: str) -> None:
    request_info(request.scope).model = name
