"""Model threads run at a lower CPU priority than the event loop.

On a busy core the event loop must keep reading requests, answering probes and refusing what
does not fit; the model threads use whatever it leaves. Without this, at 4x overload on one
core the loop got a third of the CPU (one thread of three), read requests seconds late and
answered 429s seconds late.
"""

from __future__ import annotations

import contextlib
import os
import threading

MODEL_THREAD_NICENESS = 5  # added to the process's niceness, per thread (Linux)


def lower_priority(niceness: int = MODEL_THREAD_NICENESS) -> None:
    """Makes the calling thread `niceness` steps nicer; a no-op where threads have no priority."""
    with contextlib.suppress(AttributeError, OSError):
        tid = threading.get_native_id()
        os.setpriority(os.PRIO_PROCESS, tid, min(19, os.getpriority(os.PRIO_PROCESS, tid) + niceness))
