"""What a server process looks like from outside while it is under load: readiness, queue depth
and active sequences (its /metrics), resident memory and open file descriptors (/proc)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from dataclasses import dataclass

from bench.loadgen import Shot, fetch


@dataclass(frozen=True)
class Sample:
    t: float  # time.monotonic()
    ready: int  # /readyz status, 0: no answer
    ready_ms: float
    queue_depth: float  # the deepest model queue
    active_sequences: float
    rss_mb: float
    fds: int


def metric_sum(text: str, name: str) -> float:
    """The sum of one metric's samples over all its label sets."""
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            total += float(line.rsplit(" ", 1)[1])
    return total


def metric_max(text: str, name: str) -> float:
    """The largest of one metric's samples over its label sets (e.g. the deepest model queue)."""
    values = [float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name + "{")]
    return max(values, default=0.0)


def rss_mb(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def open_fds(pid: int) -> int:
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return 0


async def sample(host: str, port: int, pid: int) -> Sample:
    ready = await fetch(host, port, Shot("readyz", "/readyz", method="GET"), 5.0)
    metrics = await fetch(host, port, Shot("metrics", "/metrics", method="GET"), 5.0)
    text = metrics.body.decode(errors="replace")
    return Sample(
        t=time.monotonic(),
        ready=ready.status,
        ready_ms=ready.seconds * 1000,
        queue_depth=metric_max(text, "inference_queue_depth"),
        active_sequences=metric_sum(text, "inference_active_sequences"),
        rss_mb=rss_mb(pid),
        fds=open_fds(pid),
    )


async def watch(host: str, port: int, pid: int, interval: float, stop: asyncio.Event) -> list[Sample]:
    """Samples every `interval` s until `stop` is set."""
    out: list[Sample] = []
    while not stop.is_set():
        out.append(await sample(host, port, pid))
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), interval)
    return out
