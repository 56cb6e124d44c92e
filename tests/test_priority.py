"""Model threads run below the event loop's priority, and only they do."""

from __future__ import annotations

import os
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import onnxruntime as ort
import pytest

from service import priority
from service.app import create_app
from service.priority import lower_priority
from service.settings import Settings


def _policy() -> int:
    return os.sched_getscheduler(threading.get_native_id())


linux = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="SCHED_IDLE is Linux's")


@linux
def test_a_model_thread_runs_under_sched_idle_and_the_caller_keeps_its_policy() -> None:
    priority.use("idle")  # the default; an app created earlier in the session may have chosen "nice"
    before = _policy()
    with ThreadPoolExecutor(1, "model", lower_priority) as pool:
        assert pool.submit(_policy).result() == os.SCHED_IDLE
    assert _policy() == before != os.SCHED_IDLE


@linux
def test_the_nice_policy_makes_model_threads_nicer_and_keeps_them_normal() -> None:
    """For hosts shared with busy processes: SCHED_IDLE threads would wait for all of them."""
    priority.use("nice")
    try:
        with ThreadPoolExecutor(1, "model", lower_priority) as pool:
            policy, niceness = pool.submit(lambda: (_policy(), os.getpriority(os.PRIO_PROCESS, 0))).result()
    finally:
        priority.use("idle")
    assert policy == os.SCHED_OTHER and niceness == min(19, os.getpriority(os.PRIO_PROCESS, 0) + 5)


@linux
def test_the_loader_thread_runs_under_sched_idle(tiny_store: Path) -> None:
    """It creates the ONNX Runtime sessions, whose worker threads inherit its priority."""
    models = create_app(Settings(model_store=tiny_store, threads=1)).state.serve.models
    try:
        assert models.executor.submit(_policy).result() == os.SCHED_IDLE
    finally:
        models.executor.shutdown()


@linux
def test_onnx_runtime_workers_inherit_the_priority_of_the_thread_creating_the_session(tiny_store: Path) -> None:
    model = next((tiny_store / "tiny-clf" / "1").glob("*.onnx"))
    sessions: list[ort.InferenceSession] = []

    def load() -> None:
        options = ort.SessionOptions()
        options.intra_op_num_threads = 3
        sessions.append(ort.InferenceSession(str(model), options, providers=["CPUExecutionProvider"]))

    before = _threads()
    with ThreadPoolExecutor(1, "loader", lower_priority) as pool:
        pool.submit(load).result()
    policies = [p for t, _ in _threads() - before if (p := _policy_of(t)) is not None]
    assert len(policies) >= 2  # the session's pool (the loader thread itself has ended)
    assert set(policies) == {os.SCHED_IDLE}


def _threads() -> set[tuple[int, int]]:
    """The process's threads as (id, start time): a thread id freed by another test's thread may be
    given again to a new one (ids wrap at pid_max), which its start time tells apart."""
    out = set()
    for t in os.listdir("/proc/self/task"):
        try:
            stat = Path(f"/proc/self/task/{t}/stat").read_text()
        except FileNotFoundError:  # ended since it was listed
            continue
        out.add((int(t), int(stat.rsplit(")", 1)[1].split()[19])))  # field 22, starttime
    return out


def _policy_of(thread: int) -> int | None:
    """None for a thread that ended since it was listed (another test's pool winding down)."""
    try:
        return os.sched_getscheduler(thread)
    except ProcessLookupError:
        return None
