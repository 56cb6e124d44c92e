"""The served models: scan the store, load and warm up each version as its task, resolve requests.

No HTTP here. `load()` is blocking (hashing, session creation, warm-up) and runs in the model
worker thread; `start()` then starts each task's queue on the event loop.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import Literal

from service import store
from service.contract.manifest import ManifestError, read_manifest
from service.engine.runtime import LoadOptions, cpu_quota
from service.errors import InvalidInput, ModelNotFound, NotReady
from service.metrics import Metrics
from service.settings import Settings
from service.tasks import registry
from service.tasks.base import Task, TaskContext

log = logging.getLogger(__name__)

Status = Literal["loading", "ready", "failed"]


@dataclass
class ServedModel:
    name: str
    version: int
    task_name: str | None  # also known for a broken version whose manifest.json still parses
    status: Status = "loading"
    error: str | None = None
    task: Task | None = None

    def ready_task(self) -> Task:
        """The task object, when this model serves; NotReady otherwise."""
        if self.status == "failed":
            raise NotReady(f"model {self.name} is not available: it failed to load")
        if self.status != "ready" or self.task is None:
            raise NotReady(f"model {self.name} is still loading")
        return self.task


class ModelSet:
    def __init__(self, settings: Settings, metrics: Metrics, executor: Executor) -> None:
        self.settings, self.metrics, self.executor = settings, metrics, executor
        self.models: dict[str, ServedModel] = {}
        self.problems: list[str] = []  # store-level reasons not to be ready
        self.loaded = False  # load() has finished (successfully or not)

    # -- start-up ----------------------------------------------------------------------------

    def load(self) -> None:
        """Scan, verify, load and warm up every model (blocking). Failures are logged and kept."""
        s = self.settings
        try:
            entries = store.newest(store.scan(s.model_store))
        except Exception as exc:
            self.problems.append(f"model store {s.model_store}: {exc}")
            log.error("model store not usable: %s", exc)
            self.loaded = True
            return
        for name, entry in sorted(entries.items()):
            self.models[name] = ServedModel(name, entry.version, _task_name(entry))
        if not entries:
            self.problems.append(f"model store {s.model_store} holds no model")
            log.error("model store %s holds no model", s.model_store)
        for cls in registry.tasks():
            wanted = getattr(s, cls.default_setting, None)
            m = self.models.get(wanted) if wanted else None
            if wanted and (m is None or (m.task_name is not None and m.task_name != cls.name)):
                self.problems.append(f"default {cls.name} model {wanted!r} is not a {cls.name} model in the store")
                log.error("settings name %r as the default %s model; the store has no such model", wanted, cls.name)
        present = [c for c in registry.tasks() if any(m.task_name == c.name for m in self.models.values())]
        threads = split_threads(s, s.threads or cpu_quota(), present)
        log.info("CPU threads per task: %s", ", ".join(f"{k} {v}" for k, v in threads.items()) or "none")
        for name, entry in sorted(entries.items()):
            task = self.models[name].task_name or ""
            options = LoadOptions(s.provider_list, threads.get(task, 1), s.variant)
            self._load_one(self.models[name], entry, options)
        self.loaded = True

    def _load_one(self, model: ServedModel, entry: store.StoreEntry, options: LoadOptions) -> None:
        if entry.manifest is None:
            model.status, model.error = "failed", entry.error
            log.error("model %s version %d is not served: %s", model.name, entry.version, entry.error)
            return
        cls = registry.get(entry.manifest.task)
        if cls is None:
            known = ", ".join(sorted(c.name for c in registry.tasks()))
            model.status, model.error = "failed", f"unknown task {entry.manifest.task!r} (this service serves {known})"
            log.error("model %s version %d is not served: %s", model.name, entry.version, model.error)
            return
        try:
            t0 = time.perf_counter()
            context = TaskContext(self.settings, self.metrics.observer(model.name))
            model.task = cls.load(entry, options, context)
        except Exception as exc:
            first_line = (str(exc).strip().splitlines() or [""])[0][:300]
            model.status, model.error = "failed", f"{type(exc).__name__}: {first_line}"
            log.exception("model %s version %d failed to load", model.name, entry.version)
            return
        log.info(
            "model %s version %d (%s, %s) loaded and warmed up in %.2f s",
            model.name,
            entry.version,
            cls.name,
            model.task.variant,
            time.perf_counter() - t0,
        )

    def start(self) -> None:
        """Starts every loaded model's queue (on the event loop); then those models are ready."""
        for model in self.models.values():
            if model.task is not None:
                model.task.start()
                model.status = "ready"

    async def close(self, timeout: float) -> None:
        """Lets admitted work finish (up to `timeout` s in all), then stops every queue."""
        deadline = time.monotonic() + timeout
        for model in self.models.values():
            if model.task is not None:
                await model.task.close(max(0.0, deadline - time.monotonic()))

    # -- state -------------------------------------------------------------------------------

    @property
    def ready(self) -> bool:
        return (
            self.loaded
            and not self.problems
            and bool(self.models)
            and all(m.status == "ready" for m in self.models.values())
        )

    def not_ready_reasons(self) -> list[str]:
        if not self.loaded:
            loading = [m.name for m in self.models.values() if m.status == "loading"]
            return [f"loading and warming up models{': ' + ', '.join(loading) if loading else ''}"]
        reasons = list(self.problems)
        for m in self.models.values():
            if m.status == "failed":
                reasons.append(f"model {m.name} version {m.version} failed: {m.error}")
            elif m.status == "loading":
                reasons.append(f"model {m.name} is not started")
        return reasons

    @property
    def in_flight(self) -> int:
        return sum(m.task.in_flight for m in self.models.values() if m.task is not None)

    def get(self, name: str) -> ServedModel:
        found = self.models.get(name)
        if found is None:
            known = ", ".join(sorted(self.models)) or "none"
            raise ModelNotFound(f"no model named {name!r} (served: {known})")
        return found

    def resolve(self, name: str | None, task_name: str) -> Task:
        """The ready task object of the model a request names, or of the task's default model."""
        model = self._default(task_name) if name is None else self.get(name)
        if model.task_name is not None and model.task_name != task_name:
            raise InvalidInput(f"model: {model.name!r} is a {model.task_name} model, not a {task_name} model")
        return model.ready_task()

    def _default(self, task_name: str) -> ServedModel:
        cls = registry.get(task_name)
        wanted = getattr(self.settings, cls.default_setting, None) if cls else None
        if wanted:
            if wanted not in self.models:
                raise ModelNotFound(f"the default {task_name} model {wanted!r} is not in the store")
            return self.models[wanted]
        candidates = [m for m in self.models.values() if m.task_name == task_name]
        if not candidates and not self.loaded:
            raise NotReady("models are still loading")
        if not candidates:
            raise ModelNotFound(f"no {task_name} model is served")
        if len(candidates) > 1:
            names = ", ".join(m.name for m in candidates)
            raise InvalidInput(f"model: several {task_name} models are served ({names}); name one")
        return candidates[0]


def split_threads(settings: Settings, total: int, tasks: Sequence[type[Task]]) -> dict[str, int]:
    """Threads per task, so that tasks working at once never oversubscribe the CPUs: a task's
    setting when given; else its `cpu_share` of `total`; tasks without a share split what is left.
    Every task gets at least one (on one CPU, tasks then take turns)."""
    out = {c.name: int(getattr(settings, c.threads_setting, 0) or 0) for c in tasks}
    for c in tasks:
        if not out[c.name] and c.cpu_share:
            out[c.name] = max(1, round(total * c.cpu_share))
    rest = [c.name for c in tasks if not out[c.name]]
    left = total - sum(out.values())
    for name in rest:
        out[name] = max(1, left // len(rest))
    return out


def _task_name(entry: store.StoreEntry) -> str | None:
    """The task a version is meant for, also for a broken one (so its requests get 503, not 404)."""
    if entry.manifest is not None:
        return entry.manifest.task
    try:
        return read_manifest(entry.folder).task
    except ManifestError:
        return None
