"""The served models: load and warm up the store, one batcher per model, classify and translate.

No HTTP here. `load()` is blocking (hashing, session creation, warm-up) and runs in the model
worker thread; `start()` then starts the batchers on the event loop. Requests are tokenized by
the caller's task (so a too-long text is refused before it is queued) and each text becomes one
batcher item; the answer keeps input order.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from service import registry
from service.batching import BatchLimits, DynamicBatcher
from service.decoding import DecodeParams, Hypothesis
from service.engine import ClassifierEngine, Engine, LoadOptions, TranslatorEngine, load_engine
from service.errors import InvalidInput, ModelNotFound, NotReady
from service.manifest import Manifest, ManifestError, read_manifest
from service.metrics import BatchMetrics, Metrics
from service.settings import Settings

log = logging.getLogger(__name__)

Task = Literal["classification", "translation"]
Status = Literal["loading", "ready", "failed"]


@dataclass(frozen=True)
class TranslateItem:
    ids: list[int]
    params: DecodeParams  # max_new_tokens is this item's own limit


def decode_key(item: TranslateItem) -> tuple[int, float, int]:
    """Items batch together when they decode alike; max_new_tokens may differ (per-row limits)."""
    p = item.params
    return (p.beam_size, p.length_penalty, p.num_hypotheses)


@dataclass
class ServedModel:
    name: str
    version: int
    manifest: Manifest | None
    status: Status = "loading"
    error: str | None = None
    engine: Engine | None = None
    batcher: DynamicBatcher[Any, Any] | None = None  # items and results differ by task
    observer: BatchMetrics | None = None
    task: str | None = None  # also known for a broken version whose manifest.json still parses

    def __post_init__(self) -> None:
        if self.manifest is not None:
            self.task = self.manifest.task


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
            entries = registry.newest(registry.scan(s.model_store))
        except Exception as exc:
            self.problems.append(f"model store {s.model_store}: {exc}")
            log.error("model store not usable: %s", exc)
            self.loaded = True
            return
        for name, entry in sorted(entries.items()):
            self.models[name] = ServedModel(name, entry.version, entry.manifest, task=_unverified_task(entry))
        if not entries:
            self.problems.append(f"model store {s.model_store} holds no model")
            log.error("model store %s holds no model", s.model_store)
        for wanted, task in ((s.default_classifier, "classification"), (s.default_translator, "translation")):
            m = self.models.get(wanted) if wanted else None
            if wanted and (m is None or (m.manifest is not None and m.task != task)):
                self.problems.append(f"default {task} model {wanted!r} is not a {task} model in the store")
                log.error("settings name %r as the default %s model; the store has no such model", wanted, task)
        options = LoadOptions(s.provider_list, s.threads, s.variant)
        for name, entry in sorted(entries.items()):
            model = self.models[name]
            if entry.manifest is None:
                model.status, model.error = "failed", entry.error
                log.error("model %s version %d is not served: %s", name, entry.version, entry.error)
                continue
            try:
                t0 = time.perf_counter()
                engine = load_engine(entry, options)
                engine.warmup()
            except Exception as exc:
                first_line = (str(exc).strip().splitlines() or [""])[0][:300]
                model.status, model.error = "failed", f"{type(exc).__name__}: {first_line}"
                log.exception("model %s version %d failed to load", name, entry.version)
                continue
            model.engine = engine
            log.info(
                "model %s version %d (%s, %s) loaded and warmed up in %.2f s",
                name,
                entry.version,
                engine.task,
                engine.variant,
                time.perf_counter() - t0,
            )
        self.loaded = True

    def start(self) -> None:
        """Starts one batcher per loaded model (on the event loop); then those models are ready."""
        s = self.settings
        limits = BatchLimits(s.max_batch_size, s.max_wait_ms / 1000, s.max_queue, s.max_batch_tokens)
        for model in self.models.values():
            engine = model.engine
            if engine is None:
                continue
            obs = model.observer = self.metrics.observer(model.name)
            batcher: DynamicBatcher[Any, Any]
            if isinstance(engine, ClassifierEngine):
                batcher = DynamicBatcher(
                    model.name, _classify_batch(engine, obs), limits, size=len, executor=self.executor, observer=obs
                )
            else:
                batcher = DynamicBatcher(
                    model.name,
                    _translate_batch(engine, obs),
                    limits,
                    key=decode_key,
                    size=lambda it: len(it.ids) * it.params.beam_size,
                    executor=self.executor,
                    observer=obs,
                )
            batcher.start()
            model.batcher, model.status = batcher, "ready"

    async def close(self, timeout: float) -> None:
        """Lets admitted work finish (up to `timeout` s in all), then stops every batcher."""
        deadline = time.monotonic() + timeout
        for model in self.models.values():
            if model.batcher is not None:
                await model.batcher.close(max(0.0, deadline - time.monotonic()))

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
        return sum(m.batcher.in_flight for m in self.models.values() if m.batcher is not None)

    def resolve(self, name: str | None, task: Task) -> ServedModel:
        """The model a request names, or the default one for the task; it must be ready."""
        if name is None:
            model = self._default(task)
        else:
            found = self.models.get(name)
            if found is None:
                known = ", ".join(sorted(self.models)) or "none"
                raise ModelNotFound(f"no model named {name!r} (served: {known})")
            model = found
        if model.task is not None and model.task != task:
            raise InvalidInput(f"model: {model.name!r} is a {model.task} model, not a {task} model")
        if model.status == "failed":
            raise NotReady(f"model {model.name} is not available: it failed to load")
        if model.status != "ready" or model.batcher is None:
            raise NotReady(f"model {model.name} is still loading")
        return model

    def _default(self, task: Task) -> ServedModel:
        wanted = self.settings.default_classifier if task == "classification" else self.settings.default_translator
        if wanted:
            if wanted not in self.models:
                raise ModelNotFound(f"the default {task} model {wanted!r} is not in the store")
            return self.models[wanted]
        candidates = [m for m in self.models.values() if m.task == task]
        if not candidates and not self.loaded:
            raise NotReady("models are still loading")
        if not candidates:
            raise ModelNotFound(f"no {task} model is served")
        if len(candidates) > 1:
            names = ", ".join(m.name for m in candidates)
            raise InvalidInput(f"model: several {task} models are served ({names}); name one")
        return candidates[0]

    # -- inference ---------------------------------------------------------------------------

    async def classify(self, model: ServedModel, texts: Sequence[str], deadline: float) -> np.ndarray:
        """(N, C) class probabilities in input order."""
        engine, batcher = model.engine, model.batcher
        assert isinstance(engine, ClassifierEngine) and batcher is not None
        rows = await batcher.submit_many(engine.encode(texts), deadline)
        return np.stack(rows)

    async def translate(
        self, model: ServedModel, texts: Sequence[str], params: DecodeParams, deadline: float
    ) -> list[list[Hypothesis]]:
        """Hypotheses per text (best first) in input order."""
        engine, batcher = model.engine, model.batcher
        assert isinstance(engine, TranslatorEngine) and batcher is not None
        items = [TranslateItem(ids, params) for ids in engine.encode(texts)]
        return await batcher.submit_many(items, deadline)


def _classify_batch(engine: ClassifierEngine, obs: BatchMetrics) -> Callable[[list[list[int]]], list[np.ndarray]]:
    def run(seqs: list[list[int]]) -> list[np.ndarray]:
        t0 = time.perf_counter()
        probs = engine.classify_ids(seqs)  # (B, C)
        obs.compute_time("classify", time.perf_counter() - t0)
        return list(probs)

    return run


def _translate_batch(
    engine: TranslatorEngine, obs: BatchMetrics
) -> Callable[[list[TranslateItem]], list[list[Hypothesis]]]:
    def run(items: list[TranslateItem]) -> list[list[Hypothesis]]:
        limits = [it.params.max_new_tokens for it in items]
        params = dataclasses.replace(items[0].params, max_new_tokens=max(limits))
        hyps = engine.translate_ids([it.ids for it in items], params, limits, timer=obs.compute_time)
        obs.generated(sum(len(h[0].tokens) + int(h[0].finished) for h in hyps if h))
        return hyps

    return run


def _unverified_task(entry: registry.StoreEntry) -> str | None:
    """The task a broken version was meant for (so requests for it get 503, not 404); never served."""
    if entry.manifest is not None:
        return entry.manifest.task
    try:
        return read_manifest(entry.folder).task
    except ManifestError:
        return None
