"""The served models: which version of each model serves, loading, hot reload, resolving requests.

No HTTP here. A model may have several versions in the store; its version policy picks the one
that serves: the newest complete and intact version, or the one a setting pins
(`SERVE_MODEL_VERSIONS=en-de=3`). A version is loaded and warmed up in the loader thread while
the current one keeps serving; then new requests switch to it at once (one assignment on the
event loop), and the old version finishes its admitted work before it is dropped. A version
whose files do not match its manifest is refused (logged, counted) and never replaces a
working one. `refresh()` does this on demand (the repository API) and every
`SERVE_WATCH_INTERVAL_S` seconds when the watcher is on.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import time
from collections.abc import Sequence
from concurrent.futures import Executor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from service import store
from service.contract.manifest import MANIFEST, ManifestError, read_manifest
from service.engine.runtime import LoadOptions, cpu_quota
from service.errors import InvalidInput, ModelNotFound, NotReady
from service.metrics import Metrics
from service.settings import Settings
from service.tasks import registry
from service.tasks.base import Task, TaskContext

log = logging.getLogger(__name__)

Status = Literal["loading", "ready", "failed", "draining", "unloaded"]


@dataclass
class ServedVersion:
    version: int
    task_name: str | None  # also known for a broken version whose manifest.json still parses
    status: Status = "loading"
    error: str | None = None
    task: Task | None = None


@dataclass
class ServedModel:
    """One model name: its loaded versions and the one that answers requests naming none."""

    name: str
    versions: dict[int, ServedVersion] = field(default_factory=dict)
    current: int | None = None
    unloaded: bool = False  # through the repository API: the watcher leaves it alone
    refused: dict[int, str] = field(default_factory=dict)  # versions whose files do not match their manifest
    failed: dict[int, str] = field(default_factory=dict)  # intact versions that failed to load (retried on request)

    @property
    def serving(self) -> ServedVersion | None:
        return self.versions.get(self.current) if self.current is not None else None

    # The serving version's fields, for callers that do not care about versions.
    @property
    def version(self) -> int:
        return self.current if self.current is not None else max(self.versions, default=0)

    @property
    def task(self) -> Task | None:
        return self.serving.task if self.serving else None

    @property
    def task_name(self) -> str | None:
        v = self.serving or self.versions.get(self.version)
        return v.task_name if v else None

    @property
    def status(self) -> Status:
        if self.unloaded:
            return "unloaded"
        v = self.serving or self.versions.get(self.version)
        return v.status if v else "loading"

    @property
    def error(self) -> str | None:
        v = self.serving or self.versions.get(self.version)
        return v.error if v else None

    def ready_task(self, version: int | None = None) -> Task:
        """The task of `version` (default: the serving one) when it serves; NotReady otherwise."""
        if self.unloaded:
            raise NotReady(f"model {self.name} is unloaded")
        if version is not None and version not in self.versions:
            raise ModelNotFound(f"model {self.name} has no loaded version {version}")
        v = self.versions.get(version) if version is not None else self.serving
        if v is None or v.status == "failed":
            raise NotReady(f"model {self.name} is not available: it failed to load")
        if v.status != "ready" or v.task is None:
            raise NotReady(f"model {self.name} version {v.version} is {v.status}")
        return v.task


class ModelSet:
    def __init__(self, settings: Settings, metrics: Metrics, executor: Executor) -> None:
        self.settings, self.metrics, self.executor = settings, metrics, executor
        self.models: dict[str, ServedModel] = {}
        self.problems: list[str] = []  # store-level reasons not to be ready
        self.loaded = False  # the first load has finished (successfully or not)
        self.pinned = parse_versions(settings.model_versions)
        self._threads: dict[str, int] = {}
        self._draining: set[asyncio.Task[None]] = set()
        self._lock = asyncio.Lock()  # one refresh at a time

    # -- start-up ----------------------------------------------------------------------------

    def load(self) -> None:
        """Scans the store and loads the version each model serves (blocking: the loader thread)."""
        s = self.settings
        try:
            found = versions_in(s.model_store)
        except Exception as exc:
            self.problems.append(f"model store {s.model_store}: {exc}")
            log.error("model store not usable: %s", exc)
            self.loaded = True
            return
        if not found:
            self.problems.append(f"model store {s.model_store} holds no model")
            log.error("model store %s holds no model", s.model_store)
        chosen = {}
        for name, entries in sorted(found.items()):
            self.models[name] = ServedModel(name)
            chosen[name] = entry = self._choose(name, entries)
            self.models[name].versions[entry.version] = ServedVersion(entry.version, _task_name(entry))
        present = [c for c in registry.tasks() if any(m.task_name == c.name for m in self.models.values())]
        self._threads = split_threads(s, s.threads or cpu_quota(), present)
        log.info("CPU threads per task: %s", ", ".join(f"{k} {v}" for k, v in self._threads.items()) or "none")
        for cls in registry.tasks():
            wanted = getattr(s, cls.default_setting, None)
            m = self.models.get(wanted) if wanted else None
            if wanted and (m is None or (m.task_name is not None and m.task_name != cls.name)):
                self.problems.append(f"default {cls.name} model {wanted!r} is not a {cls.name} model in the store")
                log.error("settings name %r as the default %s model; the store has no such model", wanted, cls.name)
        for name, entry in chosen.items():
            self._load_version(self.models[name], entry)
        self.loaded = True

    def start(self) -> None:
        """Starts every loaded version's queue (on the event loop); those versions serve from then on."""
        for model in self.models.values():
            for v in model.versions.values():
                if v.task is not None and v.status == "loading":
                    v.task.start()
                    v.status = "ready"
                    model.current = v.version

    def _choose(self, name: str, entries: Sequence[store.StoreEntry]) -> store.StoreEntry:
        """The version policy: the pinned version, else the newest intact one (else the newest, broken)."""
        pinned = self.pinned.get(name)
        if pinned is not None:
            match = [e for e in entries if e.version == pinned]
            if match:
                return match[0]
            log.error("model %s: pinned version %d is not in the store; serving the newest", name, pinned)
        intact = [e for e in entries if e.manifest is not None]
        model = self.models[name]
        for e in entries:
            if e.manifest is None and (not intact or e.version > intact[-1].version):
                self._refuse(model, e.version, e.error or "broken", model.refused)
            elif e.manifest is not None:
                model.refused.pop(e.version, None)  # intact now (a copy that had not finished)
        return intact[-1] if intact else entries[-1]

    def _load_version(self, model: ServedModel, entry: store.StoreEntry) -> ServedVersion:
        """Builds and warms up one version (blocking); a failure is kept on the version."""
        v = model.versions.setdefault(entry.version, ServedVersion(entry.version, _task_name(entry)))
        if entry.manifest is None:
            v.status, v.error = "failed", entry.error
            log.error("model %s version %d is not served: %s", model.name, entry.version, entry.error)
            return v
        cls = registry.get(entry.manifest.task)
        if cls is None:
            known = ", ".join(sorted(c.name for c in registry.tasks()))
            v.status, v.error = "failed", f"unknown task {entry.manifest.task!r} (this service serves {known})"
            log.error("model %s version %d is not served: %s", model.name, entry.version, v.error)
            return v
        s = self.settings
        options = LoadOptions(s.provider_list, self._threads.get(cls.name, 1), s.variant)
        try:
            t0 = time.perf_counter()
            v.task = cls.load(entry, options, TaskContext(s, self.metrics.observer(model.name)))
        except Exception as exc:
            first_line = (str(exc).strip().splitlines() or [""])[0][:300]
            v.status, v.error = "failed", f"{type(exc).__name__}: {first_line}"
            log.exception("model %s version %d failed to load", model.name, entry.version)
            return v
        log.info(
            "model %s version %d (%s, %s) loaded and warmed up in %.2f s",
            model.name,
            entry.version,
            cls.name,
            v.task.variant,
            time.perf_counter() - t0,
        )
        return v

    # -- hot reload --------------------------------------------------------------------------

    async def watch(self, interval: float) -> None:
        """Refreshes every `interval` seconds until cancelled."""
        while True:
            await asyncio.sleep(interval)
            try:
                await self.refresh()
            except Exception:  # the watcher must outlive any one bad scan
                log.exception("model store refresh failed")

    async def refresh(self, only: str | None = None) -> None:
        """Switches every model (or `only` one) to the version its policy picks, when that changed."""
        async with self._lock:
            loop = asyncio.get_running_loop()
            found = await loop.run_in_executor(self.executor, versions_in, self.settings.model_store)
            if only is not None and only not in found:
                raise ModelNotFound(f"no model named {only!r} in the store")
            for name, entries in sorted(found.items()):
                if only is not None and name != only:
                    continue
                model = self.models.setdefault(name, ServedModel(name))
                if model.unloaded and only is None:
                    continue
                wanted = self._choose(name, entries)
                if only is not None:
                    model.failed.pop(wanted.version, None)  # an explicit load tries again
                stale = wanted.version != model.current or model.unloaded
                if stale and wanted.manifest is not None and wanted.version not in model.failed:
                    await self._switch(model, wanted)

    async def _switch(self, model: ServedModel, entry: store.StoreEntry) -> None:
        loop = asyncio.get_running_loop()
        v = await loop.run_in_executor(self.executor, self._load_version, model, entry)
        if v.task is None:
            if model.current is not None:  # the serving version stays; the broken one is forgotten
                model.versions.pop(entry.version, None)
            self._refuse(model, entry.version, v.error or "failed to load", model.failed)
            return
        v.task.start()
        v.status = "ready"
        old = model.serving
        model.unloaded = False
        model.current = entry.version  # from now on new requests go to the new version
        self.metrics.model_loads.labels(model=model.name, result="loaded").inc()
        log.info("model %s now serves version %d", model.name, entry.version)
        if old is not None and old.version != entry.version:
            self._retire(model, old)

    def _retire(self, model: ServedModel, old: ServedVersion) -> None:
        """The old version finishes its admitted work in the background, then is dropped."""
        old.status = "draining"

        async def drain() -> None:
            if old.task is not None:
                await old.task.close(self.settings.drain_timeout_s)
            model.versions.pop(old.version, None)
            log.info("model %s version %d unloaded", model.name, old.version)

        task = asyncio.create_task(drain(), name=f"drain-{model.name}-{old.version}")
        self._draining.add(task)
        task.add_done_callback(self._draining.discard)
        task.add_done_callback(lambda _: refreeze_heap())  # the dropped version's objects may be freed

    def _refuse(self, model: ServedModel, version: int, reason: str, record: dict[int, str]) -> None:
        if record.get(version) == reason:
            return  # said once is enough; a changed reason (a copy still in progress) is said again
        record[version] = reason
        log.error("model %s version %d refused: %s", model.name, version, reason)
        self.metrics.model_loads.labels(model=model.name, result="refused").inc()

    async def unload(self, name: str) -> None:
        """Stops serving a model: its versions finish their admitted work, new requests get 503."""
        model = self.get(name)
        model.unloaded = True
        for v in list(model.versions.values()):
            if v.status in ("ready", "loading"):
                self._retire(model, v)
        model.current = None

    # -- state -------------------------------------------------------------------------------

    @property
    def ready(self) -> bool:
        return (
            self.loaded
            and not self.problems
            and bool(self.models)
            and all(m.status == "ready" or m.unloaded for m in self.models.values())
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
        return sum(v.task.in_flight for m in self.models.values() for v in m.versions.values() if v.task is not None)

    def get(self, name: str) -> ServedModel:
        found = self.models.get(name)
        if found is None:
            known = ", ".join(sorted(self.models)) or "none"
            raise ModelNotFound(f"no model named {name!r} (served: {known})")
        return found

    def resolve(self, name: str | None, task_name: str, version: int | None = None) -> Task:
        """The ready task object of the model a request names (or the task's default model)."""
        model = self._default(task_name) if name is None else self.get(name)
        if model.task_name is not None and model.task_name != task_name:
            raise InvalidInput(f"model: {model.name!r} is a {model.task_name} model, not a {task_name} model")
        return model.ready_task(version)

    def _default(self, task_name: str) -> ServedModel:
        cls = registry.get(task_name)
        wanted = getattr(self.settings, cls.default_setting, None) if cls else None
        if wanted:
            if wanted not in self.models:
                raise ModelNotFound(f"the default {task_name} model {wanted!r} is not in the store")
            return self.models[wanted]
        candidates = [m for m in self.models.values() if m.task_name == task_name and not m.unloaded]
        if not candidates and not self.loaded:
            raise NotReady("models are still loading")
        if not candidates:
            raise ModelNotFound(f"no {task_name} model is served")
        if len(candidates) > 1:
            names = ", ".join(m.name for m in candidates)
            raise InvalidInput(f"model: several {task_name} models are served ({names}); name one")
        return candidates[0]

    async def close(self, timeout: float) -> None:
        """Lets admitted work finish (up to `timeout` s in all), then stops every queue."""
        deadline = time.monotonic() + timeout
        for model in self.models.values():
            for v in list(model.versions.values()):
                if v.task is not None:
                    await v.task.close(max(0.0, deadline - time.monotonic()))
        for task in list(self._draining):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


def freeze_heap() -> None:
    """Collects, then hides every object alive from the garbage collector (`gc.freeze`).

    The loaded models' objects live as long as their version. Under load, requests in flight
    survive into the oldest generation, and each full collection then walked the whole heap: the
    event loop stopped about 27 ms, five times in a 10 s overload run, and the slowest 429s waited
    for it. Once after loading, so the collector walks only what serving allocates."""
    gc.collect()
    gc.freeze()


def refreeze_heap() -> None:
    """After a version is dropped: the frozen objects become collectable again (a retired version's
    reference cycles would otherwise never be freed), and what is still alive is frozen anew."""
    gc.unfreeze()
    freeze_heap()


def versions_in(folder: Path) -> dict[str, list[store.StoreEntry]]:
    """Every version of every model whose manifest is written (an unfinished copy has none yet),
    checked against it, oldest first."""
    out: dict[str, list[store.StoreEntry]] = {}
    for e in store.scan(folder):
        if e.manifest is None and not (e.folder / MANIFEST).is_file():
            continue
        out.setdefault(e.name, []).append(e)
    return out


def parse_versions(value: str) -> dict[str, int]:
    """`en-de=3,sentiment=1` -> {"en-de": 3, "sentiment": 1} (the settings already checked the form)."""
    pairs = [p.split("=", 1) for p in value.split(",") if p.strip()]
    return {name.strip(): int(version) for name, version in pairs}


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


# --- TEMPORARY SHIM (replaced by the lifecycle branch) ---
import enum  # noqa: E402


class VersionState(enum.StrEnum):
    LOADING = "loading"
    READY = "ready"
    DRAINING = "draining"
    UNLOADED = "unloaded"
    REFUSED = "refused"
    FAILED = "failed"


@dataclass(frozen=True)
class VersionView:
    name: str
    version: int
    task_name: str | None
    state: VersionState
    current: bool
    error: str | None
    task: Task | None


@dataclass(frozen=True)
class Snapshot:
    versions: tuple[VersionView, ...]
    ready: bool
    reasons: tuple[str, ...]

    def serving(self) -> tuple[VersionView, ...]:
        return tuple(v for v in self.versions if v.current and v.state is VersionState.READY)

    def model(self, name: str) -> tuple[VersionView, ...]:
        return tuple(v for v in self.versions if v.name == name)


def _snapshot(self: ModelSet) -> Snapshot:
    out = []
    for m in self.models.values():
        for v in sorted(m.versions.values(), key=lambda v: v.version):
            st = VersionState.UNLOADED if m.unloaded else VersionState(v.status)
            out.append(VersionView(m.name, v.version, v.task_name, st, v.version == m.current, v.error, v.task))
        for version, reason in sorted({**m.refused, **m.failed}.items()):
            if version not in m.versions:
                out.append(VersionView(m.name, version, None, VersionState.REFUSED, False, reason, None))
        if not m.versions and m.unloaded:
            out.append(VersionView(m.name, m.version, m.task_name, VersionState.UNLOADED, False, None, None))
    return Snapshot(tuple(out), self.ready, () if self.ready else tuple(self.not_ready_reasons()))


def _fail(self: ModelSet, problem: str) -> None:
    self.problems.append(problem)
    self.loaded = True


ModelSet.snapshot = _snapshot  # type: ignore[attr-defined]
ModelSet.fail = _fail  # type: ignore[attr-defined]
