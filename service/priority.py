"""Model threads yield the CPU to the event loop.

On a busy core the event loop must keep reading requests, answering probes and refusing what
does not fit; the model threads use whatever it leaves. With equal priority, at 4x overload on
one core the loop got a third of the CPU (one thread of three) and answered 429s seconds late.
Niceness alone still left a waking loop behind the running model thread's time slice: clients saw
their 429 after 3.9 ms at the median, of which the server spent 0.4 ms on it. So on Linux the model
threads run under SCHED_IDLE, which any waking normal thread preempts at once (the same median:
1.1 ms). Where that policy is missing, they are made nicer instead.
"""

from __future__ import annotations

import contextlib
import os
import threading

MODEL_THREAD_NICENESS = 5  # added to the process's niceness, per thread, where SCHED_IDLE is missing


def lower_priority(niceness: int = MODEL_THREAD_NICENESS) -> None:
    """Puts the calling thread below every normal thread: SCHED_IDLE on Linux, else `niceness`
    steps nicer; a no-op where threads have no priority."""
    tid = threading.get_native_id()
    with contextlib.suppress(AttributeError, OSError):
        os.sched_setscheduler(tid, os.SCHED_IDLE, os.sched_param(0))
        return
    with contextlib.suppress(AttributeError, OSError):
        os.setpriority(os.PRIO_PROCESS, tid, min(19, os.getpriority(os.PRIO_PROCESS, tid) + niceness))
