"""The served models: which version of each model serves, loading, hot reload, resolving requests.

No HTTP here. A model may have several versions in the store; its version policy picks the one
that serves: the newest complete and intact version, or the one a setting pins
(`SERVE_MODEL_VERSIONS=en-de=3`). A version is loaded and warmed up in the loader thread while
the current one keeps serving; then new requests switch to it at once (one assignment on the
event loop), and the old version finishes its admitted work before it is dropped. A version
whose files do not match its manifest is refused (logged, counted) and never replaces a
working one. A serving version whose folder changed on disk since it was checked (a `--force`
republish) is loaded again like a new version, or refused while the files it loaded keep serving.
`refresh()` does this on demand (the repository API) and every `SERVE_WATCH_INTERVAL_S` seconds
when the watcher is on.

Each version's life is one `VersionState`, changed only through its record's transition methods
(`ModelVersion`); `ModelSet.snapshot()` is what every listing and readiness probe renders.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import gc
import logging
import time
from collections.abc import Sequence
from concurrent.futures import Executor
from dataclasses import dataclass, field
from pathlib import Path

from service import store
from service.contract.manifest import MANIFEST, ManifestError, read_manifest
from service.engine.runtime import LoadOptions, cpu_quota
from service.errors import InvalidInput, LoadRefused, ModelNotFound, NotReady
from service.metrics import Metrics
from service.settings import Settings
from service.tasks import registry
from service.tasks.base import Task, TaskContext

log = logging.getLogger(__name__)


class VersionState(enum.StrEnum):
    """Where one version of a model is in its life.

    LOADING -> READY -> DRAINING (a newer version, or a new load of its republished folder, took
    over) -> dropped once its work is done;
    LOADING, READY or DRAINING -> UNLOADED (the repository API); LOADING -> FAILED (it could not be
    loaded and nothing else serves) or REFUSED (its files do not match its manifest, or it could not
    be loaded while another version kept serving). FAILED -> UNLOADED. REFUSED is final: trying a
    version again makes a new record of it."""

    LOADING = "loading"
    READY = "ready"
    DRAINING = "draining"
    UNLOADED = "unloaded"
    REFUSED = "refused"
    FAILED = "failed"


class IllegalTransition(RuntimeError):
    """A version was asked to go where its life does not lead (a bug, never a client's error)."""


@dataclass
class ModelVersion:
    """One version of one model: the store entry it was judged on, its state, its task once loaded.

    The state changes only through the transition methods, each of which checks that it is legal."""

    entry: store.StoreEntry
    task_name: str | None  # also known for a broken version whose manifest.json still parses
    state: VersionState = VersionState.LOADING
    error: str | None = None  # why it is refused or failed
    task: Task | None = None  # the warmed-up task, from `loaded` until `release`

    @property
    def version(self) -> int:
        return self.entry.version

    def loaded(self, task: Task) -> None:
        """Built and warmed up; it does not answer until `begin_serving`."""
        self._only_from("loaded", VersionState.LOADING)
        self.task = task

    def begin_serving(self) -> None:
        """Its task's queue runs: it answers requests."""
        self._only_from("begin_serving", VersionState.LOADING)
        if self.task is None:
            raise IllegalTransition(f"version {self.version} cannot serve: it holds no loaded task")
        self.state = VersionState.READY

    def fail(self, reason: str) -> None:
        """It could not be loaded, and the model has no other version serving."""
        self._only_from("fail", VersionState.LOADING)
        if self.task is not None:
            raise IllegalTransition(f"version {self.version} holds a loaded task: it did not fail to load")
        self.state, self.error = VersionState.FAILED, reason

    def refuse(self, reason: str) -> None:
        """Its files do not match its manifest, or it could not be loaded while another version serves."""
        self._only_from("refuse", VersionState.LOADING)
        if self.task is not None:
            raise IllegalTransition(f"version {self.version} holds a loaded task: it cannot be refused")
        self.state, self.error = VersionState.REFUSED, reason

    def drain(self) -> None:
        """A newer version took over: this one finishes its admitted work, then is dropped."""
        self._only_from("drain", VersionState.READY)
        self.state = VersionState.DRAINING

    def unload(self) -> None:
        """The repository API unloaded the model: finishes its admitted work, answers no new request."""
        self._only_from("unload", VersionState.LOADING, VersionState.READY, VersionState.DRAINING, VersionState.FAILED)
        self.state, self.error = VersionState.UNLOADED, None

    def release(self) -> None:
        """Its admitted work is done: the task is let go (its state stays, for the listings)."""
        self._only_from("release", VersionState.DRAINING, VersionState.UNLOADED)
        self.task = None

    def _only_from(self, transition: str, *allowed: VersionState) -> None:
        if self.state not in allowed:
            raise IllegalTransition(f"version {self.version} is {self.state}: {transition} is not allowed")

    @property
    def held(self) -> bool:
        return _held(self.state, self.task)


@dataclass(frozen=True)
class VersionView:
    """One row of every listing: a version of a model as it is at the snapshot."""

    name: str
    version: int
    task_name: str | None
    state: VersionState
    current: bool  # the version requests without a version get
    error: str | None  # why refused or failed, else None
    task: Task | None  # the loaded task when it has one

    @property
    def held(self) -> bool:
        """A version the model has (listed with its task and `current`): not a refused one, nor the
        row of an unloaded model that has no version left."""
        return _held(self.state, self.task)


def _held(state: VersionState, task: Task | None) -> bool:
    """Loading, serving, draining or failed in the model's place: neither refused nor unloaded and done."""
    return state is not VersionState.REFUSED and not (state is VersionState.UNLOADED and task is None)


@dataclass(frozen=True)
class Snapshot:
    """The served models at one moment, for every listing and the readiness probes to render."""

    versions: tuple[VersionView, ...]  # sorted by (name, version)
    ready: bool  # every model is ready (or unloaded) and the store had no problem
    reasons: tuple[str, ...]  # why not ready; empty when ready

    def serving(self) -> tuple[VersionView, ...]:
        """The version of each model that answers requests naming none."""
        return tuple(v for v in self.versions if v.current and v.state is VersionState.READY)

    def model(self, name: str) -> tuple[VersionView, ...]:
        return tuple(v for v in self.versions if v.name == name)


@dataclass
class ServedModel:
    """One model name: every version it knows and the one that answers requests naming none.

    A model is unloaded when it serves no version and has an unloaded one: that record stays after
    its work is done, so the watcher leaves the model alone until the repository API loads it."""

    name: str
    versions: dict[int, ModelVersion] = field(default_factory=dict)
    current: int | None = None
    # A new load of the serving version's folder, changed on disk (a `--force` republish): LOADING
    # beside the serving record, or REFUSED (tried again only when the folder changes again).
    republished: ModelVersion | None = None
    # serving records that such a new load replaced in `versions`: draining, dropped when done
    replaced: list[ModelVersion] = field(default_factory=list)

    def records(self) -> list[ModelVersion]:
        """Every record that may hold a task: the listed versions and the replaced ones."""
        return [*self.versions.values(), *self.replaced]

    @property
    def unloaded(self) -> bool:
        return self.current is None and any(v.state is VersionState.UNLOADED for v in self.versions.values())

    @property
    def serving(self) -> ModelVersion | None:
        return self.versions.get(self.current) if self.current is not None else None

    # The serving version's fields (else the newest held one's), for callers that do not care about versions.
    @property
    def version(self) -> int:
        return self.current if self.current is not None else max(self._held(), default=0)

    @property
    def task(self) -> Task | None:
        return self.serving.task if self.serving else None

    @property
    def task_name(self) -> str | None:
        v = self.serving or self._held().get(self.version)
        return v.task_name if v else None

    @property
    def state(self) -> VersionState:
        if self.unloaded:
            return VersionState.UNLOADED
        v = self.serving or self._held().get(self.version)
        if v is not None:
            return v.state
        # nothing held: refused versions alone (a broken folder dropped in) serve nothing, and wait
        refused = any(r.state is VersionState.REFUSED for r in self.versions.values())
        return VersionState.REFUSED if refused else VersionState.LOADING

    @property
    def error(self) -> str | None:
        v = self.serving or self._held().get(self.version)
        return v.error if v else None

    def _held(self) -> dict[int, ModelVersion]:
        return {n: v for n, v in self.versions.items() if v.held}

    def was(self, task_name: str) -> bool:
        """Any of its versions is (or was, before an unload) a model of this task."""
        return any(v.task_name == task_name for v in self.records())

    def ready_task(self, version: int | None = None) -> Task:
        """The task of `version` (default: the serving one) when it serves; NotReady otherwise."""
        if self.unloaded:
            raise NotReady(f"model {self.name} is unloaded")
        if version is None:
            v = self.serving
        else:
            v = self._held().get(version)
            if v is None:
                raise ModelNotFound(f"model {self.name} has no loaded version {version}")
        if v is None and self.state is VersionState.LOADING:
            raise NotReady(f"model {self.name} is loading")
        if v is None or v.state is VersionState.FAILED:
            raise NotReady(f"model {self.name} is not available: it failed to load")
        if v.state is not VersionState.READY or v.task is None:
            raise NotReady(f"model {self.name} version {v.version} is {v.state}")
        return v.task

    def views(self) -> list[VersionView]:
        """Its rows: every version but those unloaded and done; an unloaded model with none left
        is one row (version 0)."""
        out = [
            VersionView(self.name, v.version, v.task_name, v.state, v.version == self.current, v.error, v.task)
            for v in self.versions.values()
            if v.state is not VersionState.UNLOADED or v.task is not None
        ]
        if self.unloaded and not any(v.state is not VersionState.REFUSED for v in out):
            out.append(VersionView(self.name, 0, None, VersionState.UNLOADED, False, None, None))
        return out


class LoadFailed(Exception):
    """A version could not be built: the reason, one line."""


class ModelSet:
    def __init__(self, settings: Settings, metrics: Metrics, executor: Executor) -> None:
        self.settings, self.metrics, self.executor = settings, metrics, executor
        self.models: dict[str, ServedModel] = {}
        self.problems: list[str] = []  # store-level reasons not to be ready
        self.loaded = False  # the first load has finished (successfully or not): the service's phase
        self.pinned = parse_versions(settings.model_versions)
        self._threads: dict[str, int] = {}
        self._draining: set[asyncio.Task[None]] = set()
        self._lock = asyncio.Lock()  # one refresh or unload at a time
        # the last scan's entries by folder: unchanged folders are not hashed (or reported) again
        self.checked: dict[Path, store.StoreEntry] = {}

    # -- start-up ----------------------------------------------------------------------------

    def load(self) -> None:
        """Scans the store and loads the version each model serves (blocking: the loader thread)."""
        s = self.settings
        try:
            found = self._scan()
        except Exception as exc:
            self.problems.append(f"model store {s.model_store}: {exc}")
            log.error("model store not usable: %s", exc)
            return
        if not found:
            self.problems.append(f"model store {s.model_store} holds no model")
            log.error("model store %s holds no model", s.model_store)
        chosen: dict[str, ModelVersion] = {}
        for name, entries in sorted(found.items()):
            model = self.models[name] = ServedModel(name)
            entry = self._choose(model, entries)
            # a broken version the policy still picks (nothing intact) was refused above; it fails below
            chosen[name] = model.versions[entry.version] = ModelVersion(entry, _task_name(entry))
        present = [c for c in registry.tasks() if any(m.task_name == c.name for m in self.models.values())]
        self._threads = split_threads(s, s.threads or cpu_quota(), present)
        log.info("CPU threads per task: %s", ", ".join(f"{k} {v}" for k, v in self._threads.items()) or "none")
        for cls in registry.tasks():
            wanted = getattr(s, cls.default_setting, None)
            m = self.models.get(wanted) if wanted else None
            if wanted and (m is None or (m.task_name is not None and m.task_name != cls.name)):
                self.problems.append(f"default {cls.name} model {wanted!r} is not a {cls.name} model in the store")
                log.error("settings name %r as the default %s model; the store has no such model", wanted, cls.name)
        for name, v in chosen.items():
            try:
                v.loaded(self._build(name, v.entry))
            except LoadFailed as exc:
                v.fail(str(exc))

    def start(self) -> None:
        """Starts every loaded version's queue (on the event loop); those versions serve from then on."""
        for model in self.models.values():
            for v in model.versions.values():
                if v.task is not None and v.state is VersionState.LOADING:
                    v.task.start()
                    v.begin_serving()
                    model.current = v.version
        self.loaded = True

    def fail(self, problem: str) -> None:
        """Loading the models failed as a whole: the service is not ready, for this reason."""
        self.problems.append(problem)
        self.loaded = True

    def _choose(self, model: ServedModel, entries: Sequence[store.StoreEntry]) -> store.StoreEntry:
        """The version policy: the pinned version, else the newest intact one (else the newest, broken)."""
        pinned = self.pinned.get(model.name)
        if pinned is not None:
            match = [e for e in entries if e.version == pinned]
            if match:
                return match[0]
            log.error("model %s: pinned version %d is not in the store; serving the newest", model.name, pinned)
        intact = [e for e in entries if e.manifest is not None]
        for e in entries:
            v = model.versions.get(e.version)
            if e.manifest is None and (not intact or e.version > intact[-1].version):
                if v is None or v.state is VersionState.REFUSED:
                    self._reject(model, e, e.error or "broken", VersionState.REFUSED)
                elif v.state is VersionState.FAILED:  # the version the model tried to serve: it stays failed
                    self._reject(model, e, e.error or "broken", VersionState.FAILED)
                # a version loaded before its files broke keeps its place
            elif (
                e.manifest is not None
                and v is not None
                and v.state is VersionState.REFUSED
                and v.entry.manifest is None
            ):
                del model.versions[e.version]  # intact now (a copy that had not finished)
        return intact[-1] if intact else entries[-1]

    def _build(self, name: str, entry: store.StoreEntry) -> Task:
        """Builds and warms up one version (blocking); LoadFailed says why it could not."""
        if entry.manifest is None:
            log.error("model %s version %d is not served: %s", name, entry.version, entry.error)
            raise LoadFailed(entry.error or "broken")
        cls = registry.get(entry.manifest.task)
        if cls is None:
            known = ", ".join(sorted(c.name for c in registry.tasks()))
            reason = f"unknown task {entry.manifest.task!r} (this service serves {known})"
            log.error("model %s version %d is not served: %s", name, entry.version, reason)
            raise LoadFailed(reason)
        s = self.settings
        device = {"auto": None, "on": True, "off": False}[s.device_buffers]
        options = LoadOptions(s.provider_list, self._threads.get(cls.name, 1), s.variant, device)
        try:
            t0 = time.perf_counter()
            task = cls.load(entry, options, TaskContext(s, self.metrics.observer(name)))
            task.figures = store.read_figures(entry)
        except Exception as exc:
            log.exception("model %s version %d failed to load", name, entry.version)
            first_line = (str(exc).strip().splitlines() or [""])[0][:300]
            raise LoadFailed(f"{type(exc).__name__}: {first_line}") from exc
        log.info(
            "model %s version %d (%s, %s) loaded and warmed up in %.2f s",
            name,
            entry.version,
            cls.name,
            task.variant,
            time.perf_counter() - t0,
        )
        return task

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
        """Switches every model (or `only` one) to the version its policy picks, when that changed,
        or loads the serving version again when its folder changed on disk since it was checked.

        A version refused or failed is tried again when its files changed, or when `only` names it;
        with `only`, a version that cannot be loaded is a LoadRefused."""
        if not self.loaded:
            raise NotReady("models are still loading")
        if only is None:
            await self._refresh(None)
            return
        # a load asked for runs to its end if its caller is cancelled (a client that left): cut off
        # half-way, the model would stay "loading"
        work = asyncio.ensure_future(self._refresh(only))
        work.add_done_callback(lambda t: t.cancelled() or t.exception())  # retrieved, whoever waits
        await asyncio.shield(work)

    async def _refresh(self, only: str | None) -> None:
        async with self._lock:
            loop = asyncio.get_running_loop()
            found = await loop.run_in_executor(self.executor, self._scan)
            if only is not None and only not in found:
                raise ModelNotFound("no model of that name in the store")
            if only is None:
                self._forget_gone(found)
            for name, entries in sorted(found.items()):
                if only is not None and name != only:
                    continue
                model = self.models.setdefault(name, ServedModel(name))
                if model.unloaded and only is None:
                    continue
                wanted = self._choose(model, entries)
                v = model.versions.get(wanted.version)
                rejected = v is not None and v.state in (VersionState.REFUSED, VersionState.FAILED)
                tried = rejected and v is not None and v.entry == wanted and only is None
                reason = None
                if wanted.version != model.current and wanted.manifest is not None and not tried:
                    reason = await self._switch(model, wanted)
                elif self._republished(model, wanted, once=only is None):
                    reason = await self._switch(model, wanted)
                    if reason is not None:
                        reason = f"it changed on disk and could not be loaded ({reason})"
                elif wanted.manifest is None and model.current is None:
                    reason = wanted.error or "broken"
                if reason is not None and only is not None:
                    serving = "; it keeps serving the files it loaded" if model.current is not None else ""
                    raise LoadRefused(f"model {name} version {wanted.version}: {reason}{serving}")

    def _forget_gone(self, found: dict[str, list[store.StoreEntry]]) -> None:
        """Refused versions whose folders are gone are no longer listed, nor a model left with
        nothing (what serves, drains or was unloaded stays)."""
        for name, model in list(self.models.items()):
            present = {e.version for e in found.get(name, [])}
            for n, v in list(model.versions.items()):
                if n not in present and v.state is VersionState.REFUSED:
                    del model.versions[n]
            if not model.versions and model.current is None and not model.unloaded and not model.replaced:
                del self.models[name]

    def _scan(self) -> dict[str, list[store.StoreEntry]]:
        entries = store.scan(self.settings.model_store, self.checked)
        self.checked = {e.folder: e for e in entries}  # replaced whole: readers never see it half-built
        return versions_in(entries)

    def on_disk(self) -> list[store.StoreEntry]:
        """Every version folder in the store now, as the last scan checked it (a folder it has not
        seen yet, or that changed since, is listed unchecked: no manifest, its reason says so)."""
        try:
            listed = store.listing(self.settings.model_store)
        except OSError:
            return []
        out = []
        for name, version, folder in listed:
            known = self.checked.get(folder)
            out.append(known or store.StoreEntry(name, version, folder, None, "not checked yet"))
        return out

    @staticmethod
    def _republished(model: ServedModel, on_disk: store.StoreEntry, once: bool) -> bool:
        """The serving version's folder changed since it was checked: load it again (`once`: unless
        this very change was already refused)."""
        serving, tried = model.serving, model.republished
        if serving is None or serving.version != on_disk.version or serving.state is not VersionState.READY:
            return False
        if serving.entry.same_files(on_disk):
            return False
        return not (once and tried is not None and tried.state is VersionState.REFUSED and tried.entry == on_disk)

    async def _switch(self, model: ServedModel, entry: store.StoreEntry) -> str | None:
        """Loads `entry` and makes it the serving version; the reason when it could not be loaded.

        The serving version's own number (its folder was republished) is a new load too: its record
        stays in place, serving, until the new one is ready, and is refused beside it when not."""
        old = model.serving
        reload = old is not None and old.version == entry.version
        v = ModelVersion(entry, _task_name(entry))  # a new try, a new record
        if reload:
            model.republished = v
            log.info("model %s version %d changed on disk: loading it again", model.name, entry.version)
        else:
            model.versions[entry.version] = v
        try:
            task = await asyncio.get_running_loop().run_in_executor(self.executor, self._build, model.name, entry)
        except LoadFailed as exc:
            if reload:
                v.refuse(str(exc))
                log.error(
                    "model %s version %d changed on disk and is refused (the files it loaded keep serving): %s",
                    model.name,
                    entry.version,
                    exc,
                )
                self.metrics.model_loads.labels(model=model.name, result="refused").inc()
                return str(exc)
            del model.versions[entry.version]  # `_reject` records it: refused beside a serving version
            self._reject(model, entry, str(exc), VersionState.FAILED if model.current is None else VersionState.REFUSED)
            return str(exc)
        v.loaded(task)
        task.start()
        v.begin_serving()
        model.versions[entry.version], model.republished = v, None
        model.current = entry.version  # from now on new requests go to the new version
        for n, done in list(model.versions.items()):
            if done.state is VersionState.UNLOADED and done.task is None:
                del model.versions[n]  # the model is loaded again: its unloaded versions are forgotten
        self.metrics.model_loads.labels(model=model.name, result="loaded").inc()
        log.info("model %s now serves version %d", model.name, entry.version)
        if old is not None and old is not v:
            old.drain()
            if reload:
                model.replaced.append(old)
            self._retire(model, old)
        return None

    def _retire(self, model: ServedModel, old: ModelVersion) -> None:
        """The old version (draining or unloaded) finishes its admitted work in the background; then
        a drained one is dropped, an unloaded one stays (without its task) while the model is unloaded."""

        async def drain() -> None:
            if old.task is not None:
                await old.task.close(self.settings.drain_timeout_s)
            old.release()
            model.replaced = [r for r in model.replaced if r is not old]
            if model.versions.get(old.version) is old and (
                old.state is VersionState.DRAINING or model.current is not None
            ):
                del model.versions[old.version]
            log.info("model %s version %d unloaded", model.name, old.version)

        task = asyncio.create_task(drain(), name=f"drain-{model.name}-{old.version}")
        self._draining.add(task)
        task.add_done_callback(self._draining.discard)
        task.add_done_callback(lambda _: refreeze_heap())  # the dropped version's objects may be freed

    def _reject(self, model: ServedModel, entry: store.StoreEntry, reason: str, state: VersionState) -> None:
        """Records a version that is not served, as `state` (REFUSED or FAILED); logged and counted once
        per reason (a changed reason, as while a copy is in progress, is said again)."""
        v = model.versions.get(entry.version)
        if v is not None and v.state is state and v.error == reason:
            return
        v = model.versions[entry.version] = ModelVersion(entry, _task_name(entry))
        if state is VersionState.FAILED:
            v.fail(reason)
        else:
            v.refuse(reason)
        log.error("model %s version %d refused: %s", model.name, entry.version, reason)
        self.metrics.model_loads.labels(model=model.name, result="refused").inc()

    async def unload(self, name: str) -> None:
        """Stops serving a model: its versions finish their admitted work, new requests get 503."""
        if not self.loaded:
            raise NotReady("models are still loading")
        async with self._lock:
            model = self.get(name)
            for v in list(model.versions.values()):
                if v.state is VersionState.DRAINING:
                    v.unload()  # its drain is under way
                elif v.state in (VersionState.LOADING, VersionState.READY, VersionState.FAILED):
                    v.unload()
                    self._retire(model, v)
            model.current, model.republished = None, None

    # -- state -------------------------------------------------------------------------------

    def snapshot(self) -> Snapshot:
        """Every version of every model as it is now, and whether the service is ready (and why not)."""
        rows = sorted((row for m in self.models.values() for row in m.views()), key=lambda r: (r.name, r.version))
        # a model with refused versions only (a broken folder dropped in later) serves nothing and
        # holds no one back: its rows say why
        states = [s for s in (m.state for m in self.models.values()) if s is not VersionState.REFUSED]
        ready = (
            self.loaded
            and not self.problems
            and bool(states)
            and all(s in (VersionState.READY, VersionState.UNLOADED) for s in states)
        )
        return Snapshot(tuple(rows), ready, () if ready else tuple(self._reasons()))

    def _reasons(self) -> list[str]:
        if not self.loaded:
            loading = [m.name for m in self.models.values() if m.state is VersionState.LOADING]
            return [f"loading and warming up models{': ' + ', '.join(loading) if loading else ''}"]
        reasons = list(self.problems)
        for m in self.models.values():
            if m.state is VersionState.FAILED:
                reasons.append(f"model {m.name} version {m.version} failed: {m.error}")
            elif m.state is VersionState.LOADING:
                reasons.append(f"model {m.name} is not started")
        return reasons

    @property
    def in_flight(self) -> int:
        return sum(v.task.in_flight for m in self.models.values() for v in m.records() if v.task is not None)

    def get(self, name: str) -> ServedModel:
        found = self.models.get(name)
        if found is None:
            known = ", ".join(sorted(self.models)) or "none"
            raise ModelNotFound(f"no model of that name (served: {known})")
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
        candidates = [m for m in self.models.values() if not m.unloaded and m.task_name == task_name]
        if len(candidates) == 1:
            return candidates[0]
        if not candidates and not self.loaded:
            raise NotReady("models are still loading")
        unloaded = [m.name for m in self.models.values() if m.unloaded and m.was(task_name)]
        if not candidates and unloaded:  # the same answer as naming it
            raise NotReady(f"model {', '.join(unloaded)} is unloaded")
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
            for v in model.records():
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


def versions_in(entries: Sequence[store.StoreEntry]) -> dict[str, list[store.StoreEntry]]:
    """Every version of every model whose manifest is written (an unfinished copy has none yet),
    checked against it, oldest first."""
    out: dict[str, list[store.StoreEntry]] = {}
    for e in entries:
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
