"""An asyncio HTTP/1.1 load generator for the reliability campaign: open-loop (Poisson) and
closed-loop arrivals, one connection per request, every outcome kept, including the requests
that got no answer at all (status 0) — which a client library would hide behind retries.

Open loop matters for overload: the arrivals do not slow down when the server does, as real
traffic does not. It is Python, so it measures answers and their kinds, not the server's best
latency (`bench/service_load.py` uses wrk for that).
"""

from __future__ import annotations

import asyncio
import random
import re
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Shot:
    """One request of a mix; `kind` names it in the report."""

    kind: str
    path: str
    body: bytes = b""
    method: str = "POST"
    content_type: str = "application/json"
    headers: tuple[tuple[str, str], ...] = ()  # more request headers (an API key)

    def wire(self, host: str) -> bytes:
        head = f"{self.method} {self.path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n"
        head += "".join(f"{k}: {v}\r\n" for k, v in self.headers)
        if self.method == "POST":
            head += f"Content-Type: {self.content_type}\r\nContent-Length: {len(self.body)}\r\n"
        return (head + "\r\n").encode() + self.body


@dataclass(frozen=True)
class Outcome:
    kind: str
    sent: float  # time.monotonic() when the request started
    seconds: float
    status: int  # 0: no answer (refused, reset, closed, or the client's timeout)
    error: str = ""
    body: bytes = b""


async def fetch(host: str, port: int, shot: Shot, timeout: float) -> Outcome:
    t0 = time.monotonic()
    writer = None
    try:
        async with asyncio.timeout(timeout):
            reader, writer = await asyncio.open_connection(host, port)
            writer.write(shot.wire(host))
            await writer.drain()
            head = await reader.readuntil(b"\r\n\r\n")
            status = int(head.split(b" ", 2)[1])
            length = re.search(rb"(?im)^content-length:\s*(\d+)", head)
            body = await reader.readexactly(int(length.group(1))) if length else await reader.read()
        return Outcome(shot.kind, t0, time.monotonic() - t0, status, body=body)
    except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError, ValueError) as exc:
        return Outcome(shot.kind, t0, time.monotonic() - t0, 0, type(exc).__name__)
    finally:
        if writer is not None:
            writer.close()


async def open_loop(
    host: str, port: int, shots: Sequence[Shot], rate: float, seconds: float, seed: int = 0, timeout: float = 30.0
) -> list[Outcome]:
    """Poisson arrivals at `rate` per second for `seconds`, shots drawn at random; waits for all.
    Outcomes in the order they finished. A finished request's task is let go at once: a soak of
    30,000 held tasks made the client's own garbage collections long enough (tens of ms, growing
    with the heap) to show in the latencies it measured."""
    rng = random.Random(seed)
    start = time.monotonic()
    at = start
    outcomes: list[Outcome] = []
    pending: set[asyncio.Task[Outcome]] = set()

    def finished(task: asyncio.Task[Outcome]) -> None:
        pending.discard(task)
        outcomes.append(task.result())

    while True:
        at += rng.expovariate(rate)
        if at - start >= seconds:
            break
        delay = at - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        task = asyncio.create_task(fetch(host, port, rng.choice(shots), timeout))
        pending.add(task)
        task.add_done_callback(finished)
    while pending:
        await asyncio.wait(set(pending))
    return outcomes


async def closed_loop(
    host: str, port: int, shots: Sequence[Shot], concurrency: int, seconds: float, timeout: float = 30.0
) -> list[Outcome]:
    """`concurrency` clients, each sending its next request when the last is answered."""
    end = time.monotonic() + seconds
    out: list[Outcome] = []

    async def client(k: int) -> None:
        rng = random.Random(k)
        while time.monotonic() < end:
            out.append(await fetch(host, port, rng.choice(shots), timeout))

    await asyncio.gather(*(client(k) for k in range(concurrency)))
    return out


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100), nearest rank; 0.0 for no values."""
    if not values:
        return 0.0
    ordered = sorted(values)
    rank = max(0, min(len(ordered) - 1, round(q / 100 * len(ordered) + 0.5) - 1))
    return ordered[rank]


def summary(outcomes: Sequence[Outcome], seconds: float) -> dict[str, Any]:
    """Counts by status and the latency of the answered (200) requests, in ms."""
    ok = [o.seconds * 1000 for o in outcomes if o.status == 200]
    return {
        "requests": len(outcomes),
        "per_s": len(outcomes) / seconds if seconds else 0.0,
        "ok_per_s": len(ok) / seconds if seconds else 0.0,
        "statuses": {str(k): v for k, v in sorted(Counter(o.status for o in outcomes).items())},
        "no_answer": dict(Counter(o.error for o in outcomes if o.status == 0)),
        "p50_ms": percentile(ok, 50),
        "p99_ms": percentile(ok, 99),
        "max_ms": max(ok, default=0.0),
    }
