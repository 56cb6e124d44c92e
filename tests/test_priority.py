"""Model threads run below the event loop's priority, and only they do."""

from __future__ import annotations

import os
import sys
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from service.priority import lower_priority


def _policy() -> int:
    return os.sched_getscheduler(threading.get_native_id())


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="SCHED_IDLE is Linux's")
def test_a_model_thread_runs_under_sched_idle_and_the_caller_keeps_its_policy() -> None:
    before = _policy()
    with ThreadPoolExecutor(1, "model", lower_priority) as pool:
        assert pool.submit(_policy).result() == os.SCHED_IDLE
    assert _policy() == before != os.SCHED_IDLE
