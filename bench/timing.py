"""How the engine benchmarks time a case and tell whether the machine was shared meanwhile.

A case is warmed up, then timed until it has both `min_runs` runs and `min_time` seconds; the
median run is its figure. The CPU time other processes used meanwhile (Linux /proc/stat) is
recorded with it: above `CONTENDED` of the machine the figure is flagged (†), and `measure`
tries again a few times hoping for a quieter moment.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

CONTENDED = 0.05  # a case during which other processes used more than this share of the CPUs is flagged


@dataclass(frozen=True)
class Timing:
    min_runs: int
    min_time: float
    warmup: int = 2
    max_runs: int = 200


def busy_cpu_seconds() -> float | None:
    """CPU seconds every process of the machine has used (Linux /proc/stat), None elsewhere."""
    try:
        fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
    except (OSError, ValueError):
        return None
    user, nice, system, _idle, _iowait, irq, softirq, steal = fields
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def own_cpu_seconds() -> float:
    t = os.times()
    return t.user + t.system


def median_seconds(fn: Callable[[], object], t: Timing) -> tuple[float, int, float | None]:
    """Warm-up runs, then runs until both min_runs and min_time are reached.

    Returns (median seconds, runs, share of the machine's CPU time other processes used meanwhile).
    """
    for _ in range(t.warmup):
        fn()
    times: list[float] = []
    busy0, own0 = busy_cpu_seconds(), own_cpu_seconds()
    start = time.perf_counter()
    while len(times) < t.max_runs and (len(times) < t.min_runs or time.perf_counter() - start < t.min_time):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    wall = time.perf_counter() - start
    busy1, own1 = busy_cpu_seconds(), own_cpu_seconds()
    others = None
    if busy0 is not None and busy1 is not None:
        others = max(0.0, (busy1 - busy0) - (own1 - own0)) / (wall * (os.cpu_count() or 1))
    return statistics.median(times), len(times), others


def measure(fn: Callable[[], object], t: Timing, retries: int = 0) -> tuple[float, int, float | None]:
    """median_seconds, measured again (up to `retries` times) while other processes used the CPUs;
    the least contended measurement is kept."""
    sec, n, others = median_seconds(fn, t)
    for _ in range(retries):
        if not others or others <= CONTENDED:
            break
        time.sleep(5)
        again = median_seconds(fn, t)
        if again[2] is not None and again[2] < others:
            sec, n, others = again
    return sec, n, others


def flag(others: float | None) -> str:
    return f"  CONTENDED: other processes used {others:.0%} of the CPUs" if others and others > CONTENDED else ""


def contention() -> dict[str, object]:
    """Other processes on the CPU make every number here meaningless: record them."""
    try:
        procs = subprocess.run(["pgrep", "-af", "export.train"], capture_output=True, text=True).stdout.strip()
    except OSError:
        procs = ""
    return {"loadavg_1m": os.getloadavg()[0], "training_processes": [p for p in procs.splitlines() if p]}
