"""Model threads yield the CPU to the event loop.

On a busy core the event loop must keep reading requests, answering probes and refusing what
does not fit; the model threads use whatever it leaves. With equal priority, at 4x overload on
one core the loop got a third of the CPU (one thread of three) and answered 429s seconds late.
Niceness alone still left a waking loop behind the running model thread's time slice: clients saw
their 429 after 3.9 ms at the median, of which the server spent 0.4 ms on it. So on Linux the model
threads run under SCHED_IDLE by default, which any waking normal thread preempts at once (the same
median: 1.1 ms).

The price: SCHED_IDLE threads get only the CPU no normal thread wants. In a container that is
the event loop alone; on a host shared with busy processes outside a container they would wait
for those too, so `SERVE_MODEL_THREAD_PRIORITY=nice` keeps the older 5 steps of niceness.
"""

from __future__ import annotations

import contextlib
import os
import threading
from typing import Literal

Policy = Literal["idle", "nice"]

MODEL_THREAD_NICENESS = 5  # added to the process's niceness, per thread: the "nice" policy
_policy: Policy = "idle"


def use(policy: Policy) -> None:
    """Sets the policy of the model threads started from now on (one per process: the settings')."""
    global _policy
    _policy = policy


def lower_priority() -> None:
    """Puts the calling thread below the event loop: SCHED_IDLE under the "idle" policy on Linux,
    else `MODEL_THREAD_NICENESS` steps nicer; a no-op where threads have no priority."""
    tid = threading.get_native_id()
    if _policy == "idle":
        with contextlib.suppress(AttributeError, OSError):
            os.sched_setscheduler(tid, os.SCHED_IDLE, os.sched_param(0))
            return
    with contextlib.suppress(AttributeError, OSError):
        niceness = os.getpriority(os.PRIO_PROCESS, tid) + MODEL_THREAD_NICENESS
        os.setpriority(os.PRIO_PROCESS, tid, min(19, niceness))
