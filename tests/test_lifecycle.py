"""A version's life (`VersionState` and its transitions) and the snapshot every listing renders,
on a `ModelSet` over the tiny store: no server."""

from __future__ import annotations

import asyncio
import json
import shutil
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import fields
from pathlib import Path
from typing import Any, cast

import pytest
import tokenizers

from service.contract import manifest as manifest_module
from service.contract.manifest import read_manifest
from service.engine.tokenizer import TextCodec
from service.errors import ModelNotFound, NotReady
from service.metrics import Metrics
from service.serving import IllegalTransition, ModelSet, ModelVersion, ServedModel, VersionState, VersionView
from service.settings import Settings
from service.store import StoreEntry, scan
from service.tasks.base import Task
from tests.conftest import corrupt_copy
from tests.helpers import add_version

pytestmark = pytest.mark.anyio
S = VersionState


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    return "asyncio"


def record(state: VersionState = S.LOADING) -> ModelVersion:
    """A version record driven to `state` through its own transitions."""
    v = ModelVersion(StoreEntry("m", 1, Path("m/1"), None, "broken"), "classification")
    task = cast(Task, object())
    paths: dict[VersionState, list[str]] = {
        S.LOADING: [],
        S.READY: ["loaded", "begin_serving"],
        S.DRAINING: ["loaded", "begin_serving", "drain"],
        S.UNLOADED: ["loaded", "begin_serving", "unload"],
        S.FAILED: ["fail"],
        S.REFUSED: ["refuse"],
    }
    for step in paths[state]:
        args: tuple[Any, ...] = (task,) if step == "loaded" else ("why",) if step in ("fail", "refuse") else ()
        getattr(v, step)(*args)
    assert v.state is state
    return v


LEGAL = {
    "loaded": {S.LOADING},
    "begin_serving": {S.LOADING},  # with a loaded task
    "fail": {S.LOADING},
    "refuse": {S.LOADING},
    "drain": {S.READY},
    "unload": {S.LOADING, S.READY, S.DRAINING, S.FAILED},
    "release": {S.DRAINING, S.UNLOADED},
}


@pytest.mark.parametrize("state", list(S))
@pytest.mark.parametrize("step", sorted(LEGAL))
def test_every_transition_is_allowed_only_from_its_states(state: VersionState, step: str) -> None:
    v = record(state)
    if step == "begin_serving" and state is S.LOADING:
        v.loaded(cast(Task, object()))
    args: tuple[Any, ...] = (
        (cast(Task, object()),) if step == "loaded" else ("why",) if step in ("fail", "refuse") else ()
    )
    if state in LEGAL[step]:
        getattr(v, step)(*args)
    else:
        with pytest.raises(IllegalTransition, match=f"is {state}: {step} is not allowed"):
            getattr(v, step)(*args)
        assert v.state is state


def test_a_version_serves_only_with_a_task_and_fails_only_without_one() -> None:
    with pytest.raises(IllegalTransition, match="holds no loaded task"):
        record().begin_serving()
    v = record()
    v.loaded(cast(Task, object()))
    with pytest.raises(IllegalTransition, match="holds a loaded task"):
        v.fail("why")
    with pytest.raises(IllegalTransition, match="holds a loaded task"):
        v.refuse("why")


def test_a_life_from_loading_to_unloaded() -> None:
    v = record()
    task = cast(Task, object())
    v.loaded(task)
    assert (v.state, v.task) == (S.LOADING, task)
    v.begin_serving()
    v.drain()
    v.unload()  # the model is unloaded while this version drains
    assert v.held and v.task is task
    v.release()
    assert (v.state, v.task, v.held) == (S.UNLOADED, None, False)
    failed = record()
    failed.fail("it broke")
    assert (failed.state, failed.error, failed.held) == (S.FAILED, "it broke", True)
    failed.unload()
    assert (failed.state, failed.error) == (S.UNLOADED, None)


def test_the_state_is_the_enum_and_nothing_beside_it() -> None:
    """No status string, `unloaded` flag or refused/failed dicts: a model is its version records."""
    assert [f.name for f in fields(ModelVersion)] == ["entry", "task_name", "state", "error", "task"]
    # besides its versions, a model holds only records of the same kind: a new load of its republished
    # serving version, and the records such a load replaced while they drain
    assert [f.name for f in fields(ServedModel)] == ["name", "versions", "current", "republished", "replaced"]


# -- the snapshot of a ModelSet over the tiny store ----------------------------------------------


@pytest.fixture
async def models(tiny_store: Path, tmp_path: Path) -> AsyncIterator[ModelSet]:
    store = tmp_path / "store"
    shutil.copytree(tiny_store, store)
    executor = ThreadPoolExecutor(max_workers=1)
    settings = Settings(model_store=store, threads=1, max_wait_ms=2, drain_timeout_s=5)
    models = ModelSet(settings, Metrics(), executor)
    await asyncio.get_running_loop().run_in_executor(executor, models.load)
    models.start()
    try:
        yield models
    finally:
        await models.close(5)
        executor.shutdown()


def rows(models: ModelSet, name: str) -> list[tuple[int, VersionState, bool]]:
    return [(v.version, v.state, v.current) for v in models.snapshot().model(name)]


async def drained(models: ModelSet) -> None:
    while models._draining:
        await asyncio.sleep(0.01)


async def test_snapshot_of_a_started_store(models: ModelSet) -> None:
    snap = models.snapshot()
    assert snap.ready and snap.reasons == ()
    assert [(v.name, v.version, v.task_name, v.state, v.current, v.error) for v in snap.versions] == [
        ("tiny-clf", 1, "classification", S.READY, True, None),
        ("tiny-mt", 1, "translation", S.READY, True, None),
    ]
    assert snap.serving() == snap.versions and all(v.task is not None for v in snap.versions)
    assert [v.name for v in snap.model("tiny-mt")] == ["tiny-mt"] and snap.model("nope") == ()
    with pytest.raises(ModelNotFound, match=r"no model of that name \(served: tiny-clf, tiny-mt\)"):
        models.get("nope")


async def test_refused_switched_drained_unloaded_and_loaded_again(models: ModelSet) -> None:
    store = models.settings.model_store
    add_version(store / "tiny-clf", 1, 2, corrupt="model.onnx")
    await models.refresh()
    refused = models.snapshot().model("tiny-clf")[1]
    assert (refused.version, refused.state, refused.current, refused.task) == (2, S.REFUSED, False, None)
    assert refused.error is not None and "model.onnx" in refused.error
    assert models.snapshot().ready  # a refused version never replaces a working one

    add_version(store / "tiny-clf", 1, 3)
    await models.refresh()
    assert rows(models, "tiny-clf") in (
        [(1, S.DRAINING, False), (2, S.REFUSED, False), (3, S.READY, True)],
        [(2, S.REFUSED, False), (3, S.READY, True)],
    )
    await drained(models)
    assert rows(models, "tiny-clf") == [(2, S.REFUSED, False), (3, S.READY, True)]
    assert models.resolve("tiny-clf", "classification").entry.version == 3

    await models.unload("tiny-clf")
    assert all(s in (S.UNLOADED, S.REFUSED) for _, s, _ in rows(models, "tiny-clf"))
    with pytest.raises(NotReady, match="model tiny-clf is unloaded"):
        models.resolve("tiny-clf", "classification")
    await drained(models)
    unloaded = models.snapshot().model("tiny-clf")
    assert [(v.version, v.state, v.task, v.held) for v in unloaded] == [
        (0, S.UNLOADED, None, False),  # the model, once no version is left
        (2, S.REFUSED, None, False),
    ]
    snap = models.snapshot()
    assert snap.ready and [v.name for v in snap.serving()] == ["tiny-mt"]  # an unloaded model is not waited for
    await models.refresh()
    assert rows(models, "tiny-clf")[0] == (0, S.UNLOADED, False)  # the watcher leaves it alone

    await models.refresh("tiny-clf")
    assert rows(models, "tiny-clf") == [(2, S.REFUSED, False), (3, S.READY, True)]


async def test_ready_task_names_why_a_version_does_not_answer(models: ModelSet) -> None:
    clf = models.get("tiny-clf")
    assert clf.ready_task() is clf.ready_task(1)
    with pytest.raises(ModelNotFound, match="model tiny-clf has no loaded version 7"):
        clf.ready_task(7)
    clf.versions[1].drain()
    with pytest.raises(NotReady, match="model tiny-clf version 1 is draining"):
        clf.ready_task(1)


async def test_a_failure_of_the_whole_load_is_a_reason_not_to_be_ready(models: ModelSet) -> None:
    models.fail("loading the models failed (see the log)")
    snap = models.snapshot()
    assert not snap.ready and snap.reasons == ("loading the models failed (see the log)",)


async def test_a_broken_only_version_fails_and_says_why(tiny_store: Path, tmp_path: Path) -> None:
    store = corrupt_copy(tiny_store, tmp_path)
    executor = ThreadPoolExecutor(max_workers=1)
    models = ModelSet(Settings(model_store=store, threads=1), Metrics(), executor)
    models.load()
    models.start()
    try:
        snap = models.snapshot()
        mt: VersionView = snap.model("tiny-mt")[0]
        assert (mt.state, mt.current, mt.task_name, mt.held) == (S.FAILED, False, "translation", True)
        assert not snap.ready and len(snap.reasons) == 1
        assert snap.reasons[0].startswith("model tiny-mt version 1 failed:") and "decoder.onnx" in snap.reasons[0]
        with pytest.raises(NotReady, match="it failed to load"):
            models.resolve("tiny-mt", "translation")
    finally:
        await models.close(5)
        executor.shutdown()


async def test_a_broken_model_dropped_in_later_holds_no_one_back_and_goes_with_its_folder(models: ModelSet) -> None:
    """A model folder that holds nothing it can serve (here a copy whose manifest names another
    model) is listed as refused, the service stays ready, and once the folder is removed nothing of
    it stays listed; so for a refused version of a serving model."""
    store = models.settings.model_store
    shutil.copytree(store / "tiny-clf" / "1", store / "stray" / "1")
    add_version(store / "tiny-clf", 1, 2, corrupt="model.onnx")
    await models.refresh()
    assert rows(models, "stray") == [(1, S.REFUSED, False)] and models.get("stray").state is S.REFUSED
    assert models.snapshot().ready and models.snapshot().reasons == ()
    with pytest.raises(NotReady, match="not available"):
        models.resolve("stray", "classification")
    shutil.rmtree(store / "stray")
    shutil.rmtree(store / "tiny-clf" / "2")
    await models.refresh()
    assert "stray" not in models.models and rows(models, "tiny-clf") == [(1, S.READY, True)]


@pytest.mark.parametrize(
    "damage",
    [
        lambda v: (v / "loop").symlink_to(v / "loop"),  # a link to itself: ELOOP when looked at
        lambda v: (v / "manifest.json").write_text("[" * 200_000 + "]" * 200_000),  # nested too deep for json
        lambda v: v.rename(v.parent / "²"),  # digits to str.isdigit, not to int
    ],
    ids=["link-loop", "deep-manifest", "superscript-folder"],
)
async def test_one_odd_entry_in_the_store_never_stops_a_scan(models: ModelSet, damage) -> None:
    store = models.settings.model_store
    add_version(store / "tiny-clf", 1, 2)
    damage(store / "tiny-clf" / "2")
    add_version(store / "tiny-mt", 1, 2)  # beside it, a good new version is still picked up
    await models.refresh()
    assert rows(models, "tiny-mt")[-1] == (2, S.READY, True)
    assert models.snapshot().ready
    await drained(models)


async def test_absurd_manifest_limits_are_refused_at_load(models: ModelSet) -> None:
    store = models.settings.model_store
    add_version(store / "tiny-mt", 1, 2)
    path = store / "tiny-mt" / "2" / "manifest.json"
    path.write_text(json.dumps(json.loads(path.read_text()) | {"max_new_tokens": 10**12}))
    await models.refresh()
    assert rows(models, "tiny-mt") == [(1, S.READY, True), (2, S.REFUSED, False)]
    assert "max_new_tokens" in (models.snapshot().model("tiny-mt")[1].error or "")


async def test_a_load_asked_for_finishes_when_its_caller_is_cancelled(models: ModelSet) -> None:
    """A client that leaves cancels its route; the load it asked for goes on to serving."""
    await models.unload("tiny-clf")
    await drained(models)
    asked = asyncio.ensure_future(models.refresh("tiny-clf"))

    async def until(loading: bool) -> None:
        while (models.get("tiny-clf").state is S.LOADING) != loading:
            await asyncio.sleep(0.001)

    await asyncio.wait_for(until(loading=True), 60)
    asked.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asked
    await asyncio.wait_for(until(loading=False), 20)  # a load cut off half-way would stay "loading"
    assert rows(models, "tiny-clf") == [(1, S.READY, True)] and models.snapshot().ready


async def test_a_tokenizer_that_does_not_go_with_the_model_is_refused(tiny_store: Path) -> None:
    manifest = read_manifest(tiny_store / "tiny-clf" / "1")
    empty = tokenizers.Tokenizer(tokenizers.models.BPE()).to_str().encode()
    with pytest.raises(ValueError, match="tokenizer.json holds 0 tokens"):
        TextCodec.of(manifest, empty)


def test_a_file_the_scan_cannot_read_refuses_its_version(tiny_store: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A permission the server lacks (root, as in CI, ignores chmod: the read is made to fail)."""

    def denied(path: Path) -> str:
        raise PermissionError(13, "Permission denied", str(path))

    monkeypatch.setattr(manifest_module, "sha256_file", denied)
    entries = scan(tiny_store)
    assert entries and all(e.manifest is None and "Permission denied" in (e.error or "") for e in entries)
