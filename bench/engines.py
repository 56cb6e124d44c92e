"""The engines of a store entry for the benchmarks, whatever its task (the service itself goes
through `service.tasks`; a benchmark drives the engines directly)."""

from __future__ import annotations

from service.engine.classifier import ClassifierEngine, load_classifier
from service.engine.runtime import LoadOptions
from service.engine.translator import TranslatorEngine, load_translator
from service.store import StoreEntry

Engine = ClassifierEngine | TranslatorEngine
LOADERS = {"classification": load_classifier, "translation": load_translator}


def load_engine(entry: StoreEntry, options: LoadOptions | None = None) -> Engine:
    task = entry.require_manifest().task
    if task not in LOADERS:
        raise ValueError(f"{entry.folder}: no engine for task {task!r}")
    return LOADERS[task](entry, options)


def newest(entries: list[StoreEntry]) -> dict[str, StoreEntry]:
    """The newest version of each model, broken or not (the service picks by its version policy,
    `service.serving`); a benchmark or test given a broken one fails on it rather than skip it."""
    out: dict[str, StoreEntry] = {}
    for e in entries:
        if e.name not in out or e.version > out[e.name].version:
            out[e.name] = e
    return out
